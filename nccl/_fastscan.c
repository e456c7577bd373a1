/* The hot loops of nccl/parse.py in C: cutting a text into lines, stripping launcher prefixes, telling
 * table rows from the other lines, and reading table cells as numbers. Loaded with ctypes (which releases
 * the GIL, so pieces of a text scan side by side); parse.py falls back to its pyarrow scan where this
 * library was not built or a text holds anything outside the plain ASCII it handles (scan returns -1).
 *
 * What it must do is defined by the pyarrow scan in parse.py (_clean_lines, ascii_split_whitespace and
 * the casts of _convert); tests compare the two on every fixture and on variants of them.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Whitespace within a line: scan_lines takes only text whose bytes below ' ' are tab, CR and LF, and a
 * line holds no LF, so this is ' ', '\t' or '\r'. */
static int is_space(uint8_t c) { return c <= ' '; }

static uint64_t load8(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* Past the spaces at q (table rows are padded with runs of them): 8 at a time, then one by one. */
static const uint8_t *skip_spaces(const uint8_t *q, const uint8_t *b) {
    while (b - q >= 8 && load8(q) == 0x2020202020202020ULL) q += 8;
    while (q < b && is_space(*q)) q++;
    return q;
}

static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* The whitespace-separated tokens of a..b. A token starts at a byte that is not a space after one that is
 * (or at a): counted 8 bytes at a time, where a byte's high bit after adding 0x5F says it is above ' '
 * (no carry between bytes: they are all below 0x80). */
static int64_t count_tokens(const uint8_t *a, const uint8_t *b) {
    int64_t n = 0;
    int after_space = 1;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t high = 0x8080808080808080ULL, lift = 0x5F5F5F5F5F5F5F5FULL;
    uint64_t carried = 0;  /* the last byte's "not a space" bit, at byte 0's place */
    for (; b - a >= 8; a += 8) {
        uint64_t word = (load8(a) + lift) & high;
        uint64_t first = (word & ~((word << 8) | carried)) >> 7;  /* bit 0 of each byte starting a token */
        n += (int64_t)((first * 0x0101010101010101ULL) >> 56);       /* their sum, in the top byte */
        carried = word >> 56;
    }
    after_space = !carried;
#endif
    for (; a < b; a++) {
        n += !is_space(*a) && after_space;
        after_space = is_space(*a);
    }
    return n;
}

/* 1 if every byte is printable ASCII, tab, CR or LF: the text the scan below handles exactly. */
static int plain_ascii(const uint8_t *p, int64_t n) {
    uint8_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        bad |= (uint8_t)((c >= 0x7f) | ((c < 0x20) & (c != '\t') & (c != '\n') & (c != '\r')));
    }
    return !bad;
}

/* Length of `\d{lo,hi}` at p (0 if the run of digits is shorter than lo or longer than hi). */
static int64_t digits(const uint8_t *p, const uint8_t *end, int64_t lo, int64_t hi) {
    int64_t n = 0;
    while (p + n < end && is_digit(p[n])) n++;
    return (n >= lo && n <= hi) ? n : 0;
}

/* `\d{1,6}: ` at p: its length, or 0. */
static int64_t srun_label(const uint8_t *p, const uint8_t *end) {
    int64_t n = digits(p, end, 1, 6);
    return (n && p + n + 1 < end && p[n] == ':' && p[n + 1] == ' ') ? n + 2 : 0;
}

/* `\[\d+,\d+\]<std(?:out|err)>:` at p (mpirun --tag-output): its length, or 0. */
static int64_t mpirun_tag(const uint8_t *p, const uint8_t *end) {
    const uint8_t *q = p + 1;
    int64_t n;
    if (p >= end || *p != '[' || !(n = digits(q, end, 1, INT64_MAX))) return 0;
    q += n;
    if (q >= end || *q++ != ',' || !(n = digits(q, end, 1, INT64_MAX))) return 0;
    q += n;
    if (end - q < 10 || memcmp(q, "]<std", 5) != 0) return 0;
    q += 5;
    if (memcmp(q, "out>:", 5) != 0 && memcmp(q, "err>:", 5) != 0) return 0;
    return q + 5 - p;
}

/* A digit with '-' four bytes on: a timestamp, left to the pyarrow scan (as are its other rare prefixes). */
static int stamp(const uint8_t *a, const uint8_t *b) { return is_digit(*a) && b - a > 4 && a[4] == '-'; }

/* `#+\s*Rank\s+(\d{1,18})(?:\s|$)` over the whole line a..b (a device line): 1 and its rank, or 0. */
static int rank_line(const uint8_t *a, const uint8_t *b, int64_t *rank) {
    if (a == b || *a != '#') return 0;
    while (a < b && *a == '#') a++;
    while (a < b && is_space(*a)) a++;
    if (b - a < 5 || memcmp(a, "Rank", 4) != 0 || !is_space(a[4])) return 0;
    a += 4;
    while (a < b && is_space(*a)) a++;
    int64_t n = 0, v = 0;
    while (a + n < b && is_digit(a[n])) n++;
    if (!n || n > 18 || (a + n < b && !is_space(a[n]))) return 0;
    for (int64_t i = 0; i < n; i++) v = v * 10 + (a[i] - '0');  /* 18 digits: no overflow */
    *rank = v;
    return 1;
}

/* Line kinds, as parse.py numbers them. */
enum { HEADER, AVG, OUT_OF_BOUNDS, CONFIG, TESTS_VERSION, INFO, NCCL_VERSION, ERROR, NONE = -1 };

static int starts(const uint8_t *a, const uint8_t *b, const char *s) {
    size_t n = strlen(s);
    return (size_t)(b - a) >= n && memcmp(a, s, n) == 0;
}

static const uint8_t *find(const uint8_t *a, const uint8_t *b, const char *s) {
    return a < b ? memmem(a, b - a, s, strlen(s)) : NULL;
}

static int has(const uint8_t *a, const uint8_t *b, const char *s) { return find(a, b, s) != NULL; }

/* s at a, then at least one non-space byte (the `\S+` after a literal). */
static int starts_word(const uint8_t *a, const uint8_t *b, const char *s) {
    size_t n = strlen(s);
    return starts(a, b, s) && a + n < b && !is_space(a[n]);
}

/* parse.py's _ERROR: any of its literals anywhere in the line. */
static int error_line(const uint8_t *a, const uint8_t *b) {
    static const char *said[] = {"NCCL failure", "Test failure", "CUDA failure", "Segmentation fault",
                                 "Bus error", "noticed that process rank", "srun: error", "# error:",
                                 "ncclInternalError", "ncclSystemError", "ncclRemoteError"};
    for (size_t i = 0; i < sizeof said / sizeof *said; i++) {
        if (has(a, b, said[i])) return 1;
    }
    return 0;
}

/* parse.py's _TRANSPORT_HINT searched in the line: "NCCL INFO " then a transport-telling phrase. */
static int transport_hint(const uint8_t *a, const uint8_t *b) {
    const uint8_t *first = find(a, b, "NCCL INFO ");
    for (const uint8_t *p = first; p; p = find(p + 1, b, "NCCL INFO ")) {
        const uint8_t *q = p + 10;
        if (starts_word(q, b, "NET/OFI Selected Provider is ")
            || starts_word(q, b, "NET/OFI Selected provider is ")
            || starts(q, b, "NET/Socket :") || starts(q, b, "NET/IB :")
            || starts_word(q, b, "NET/OFI Using aws-ofi-nccl ")) {
            return 1;
        }
    }
    if (!first) return 0;
    for (const uint8_t *v = find(first + 10, b, " via "); v; v = find(v + 1, b, " via ")) {
        const uint8_t *to = v + 5;
        if (starts_word(to, b, "NET/") || starts_word(to, b, "P2P/") || starts_word(to, b, "SHM/")) return 1;
    }
    return 0;
}

/* parse.py's _kinds for one stripped line that is neither a table row nor a device line; *told: it is
 * an INFO line that matches _TRANSPORT_HINT. */
static int line_kind(const uint8_t *a, const uint8_t *b, int *told) {
    *told = 0;
    if (*a == '#') {
        const uint8_t *body = a;
        while (body < b && *body == '#') body++;
        while (body < b && is_space(*body)) body++;
        int kind = starts(body, b, "Avg bus bandwidth")      ? AVG
                   : starts(body, b, "Out of bounds values") ? OUT_OF_BOUNDS
                   : starts(body, b, "nThread")              ? CONFIG
                   : starts(body, b, "nccl-tests version")   ? TESTS_VERSION
                   : starts(body, b, "size") && has(body, b, " count") ? HEADER
                                                                        : NONE;
        return kind != NONE ? kind : error_line(a, b) ? ERROR : NONE;
    }
    if (has(a, b, "NCCL INFO")) {
        *told = transport_hint(a, b);
        return *told || has(a, b, "Using network") ? INFO : NONE;
    }
    if (starts(a, b, "NCCL version")) return NCCL_VERSION;
    return error_line(a, b) ? ERROR : NONE;
}

/* The number of '\n' in data[begin:end]: a bound on the lines scan_lines writes. */
int64_t count_lines(const uint8_t *data, int64_t begin, int64_t end) {
    int64_t n = 0;
    for (int64_t i = begin; i < end; i++) n += data[i] == '\n';
    return n;
}

/* Scan the lines of data[begin:end] (cut at '\n', stripped of whitespace, mpirun tags and srun labels).
 * A line starting with a digit is a table row: its bounds and token count go to row_*. A "Rank N"
 * device line gives its rank to ranks. Any other line that line_kind finds structural is
 * copied to other_buf (other_off: offsets; other_kind and other_told, as line_kind says; other_rows and
 * other_ranks: the table rows and device lines before it). Outputs hold one entry per line at most
 * (other_off one more); counts gets [structural lines, rows, ranks].
 * Returns 0, or -1 where the text is not plain ASCII or a line has a timestamp (nothing is then valid). */
int64_t scan_lines(const uint8_t *data, int64_t begin, int64_t end, int64_t *other_off, uint8_t *other_buf,
                   int64_t *other_kind, int64_t *other_told, int64_t *other_rows, int64_t *other_ranks,
                   int64_t *row_start, int64_t *row_end, int64_t *row_tokens, int64_t *ranks,
                   int64_t *counts) {
    if (!plain_ascii(data + begin, end - begin)) return -1;
    int64_t n_other = 0, n_rows = 0, n_ranks = 0, used = 0;
    other_off[0] = 0;
    const uint8_t *p = data + begin, *stop = data + end;
    while (p < stop) {
        const uint8_t *nl = memchr(p, '\n', stop - p);
        const uint8_t *a = p, *b = nl ? nl : stop;
        p = nl ? nl + 1 : stop;
        while (a < b && is_space(*a)) a++;
        while (b > a && is_space(b[-1])) b--;
        if (a == b) continue;
        if (stamp(a, b)) return -1;
        int64_t cut = 0;
        if (*a == '[' && (cut = mpirun_tag(a, b))) {
            while (a + cut < b && is_space(a[cut])) cut++;
            cut += srun_label(a + cut, b);
        } else if (is_digit(*a)) {
            cut = srun_label(a, b);
        }
        if (cut) {
            a += cut;
            while (a < b && is_space(*a)) a++;
            if (a == b) continue;
            if (stamp(a, b)) return -1;
        }
        if (is_digit(*a)) {
            row_start[n_rows] = a - data;
            row_end[n_rows] = b - data;
            row_tokens[n_rows++] = count_tokens(a, b);
        } else if (rank_line(a, b, ranks + n_ranks)) {
            n_ranks++;
        } else {
            int told, kind = line_kind(a, b, &told);
            if (kind == NONE) continue;
            memcpy(other_buf + used, a, b - a);
            used += b - a;
            other_kind[n_other] = kind;
            other_told[n_other] = told;
            other_rows[n_other] = n_rows;
            other_ranks[n_other] = n_ranks;
            other_off[++n_other] = used;
        }
    }
    counts[0] = n_other;
    counts[1] = n_rows;
    counts[2] = n_ranks;
    return 0;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* `-?\d+` with at most 18 digits (so no overflow) as int64. Returns 1 if the token is one. */
static int read_int(const uint8_t *p, const uint8_t *end, int64_t *out) {
    int neg = p < end && *p == '-';
    p += neg;
    if (p == end || end - p > 18) return 0;
    int64_t v = 0;
    for (; p < end; p++) {
        if (!is_digit(*p)) return 0;
        v = v * 10 + (*p - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

/* `-?\d+(\.\d+)?([eE][+-]?\d+)?` as the nearest double. Returns 1 if the token has that form. Up to 15
 * significant digits and a power of ten within 1e22 it is one exact multiply or divide (so correctly
 * rounded); anything longer goes to strtod, which also rounds correctly. */
static int read_float(const uint8_t *p, const uint8_t *end, double *out) {
    const uint8_t *s = p;
    int neg = p < end && *p == '-';
    p += neg;
    uint64_t m = 0;
    int64_t n = 0, frac = 0, exp = 0, sig = 0;
    for (; p < end && is_digit(*p); p++, n++) {
        if (m || *p != '0') sig++;
        m = m * 10 + (*p - '0');
    }
    if (!n) return 0;
    if (p < end && *p == '.') {
        p++;
        for (; p < end && is_digit(*p); p++, frac++) {
            if (m || *p != '0') sig++;
            m = m * 10 + (*p - '0');
        }
        if (!frac) return 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = p < end && (*p == '-' || *p == '+') ? *p++ == '-' : 0;
        int64_t e = 0, ed = 0;
        for (; p < end && is_digit(*p); p++, ed++) {
            if (e < 100000) e = e * 10 + (*p - '0');
        }
        if (!ed) return 0;
        exp = eneg ? -e : e;
    }
    if (p != end) return 0;
    int64_t e10 = exp - frac;
    if (sig <= 15 && e10 >= -22 && e10 <= 22) {
        double v = (double)m;
        v = e10 < 0 ? v / POW10[-e10] : v * POW10[e10];
        *out = neg ? -v : v;
        return 1;
    }
    char buf[128];
    if (end - s >= (int64_t)sizeof buf) return 0;
    memcpy(buf, s, end - s);
    buf[end - s] = 0;
    *out = strtod(buf, NULL);
    return 1;
}

/* Tokens of rows data[start[k]:end[k]] (split on whitespace, as scan_lines counted them), one pass over
 * the rows for all columns: column j is token col[j] of each row, read as kind[j] (0 a double, 1 an int64,
 * 2 its bounds, as start/end pairs) into out[j]. ok[j] stays 1 if every token of column j had its kind's
 * form, else it is set to 0 (out[j] is then not all valid). A row without token col[j] gives empty bounds
 * at its end. */
void take_columns(const uint8_t *data, const int64_t *start, const int64_t *end, int64_t n, int64_t ncols,
                  const int64_t *col, const int64_t *kind, void *const *out, int64_t *ok) {
    int64_t last = -1;
    for (int64_t j = 0; j < ncols; j++) last = col[j] > last ? col[j] : last;
    int64_t *want = malloc((last + 1) * sizeof *want);  /* token index -> column j, or -1 */
    if (!want) {
        for (int64_t j = 0; j < ncols; j++) ok[j] = 0;
        return;
    }
    for (int64_t i = 0; i <= last; i++) want[i] = -1;
    for (int64_t j = 0; j < ncols; j++) want[col[j]] = j;
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *q = data + start[k], *b = data + end[k];
        int64_t i = 0;
        for (; q < b && i <= last; i++) {
            q = skip_spaces(q, b);
            const uint8_t *t = q;
            while (q < b && !is_space(*q)) q++;
            int64_t j = want[i];
            if (j < 0) continue;
            if (kind[j] == 0) {
                ok[j] &= read_float(t, q, (double *)out[j] + k);
            } else if (kind[j] == 1) {
                ok[j] &= read_int(t, q, (int64_t *)out[j] + k);
            } else {
                ((int64_t *)out[j])[2 * k] = t - data;
                ((int64_t *)out[j])[2 * k + 1] = q - data;
            }
        }
        for (; i <= last; i++) {  /* a row short of the column */
            int64_t j = want[i];
            if (j < 0) continue;
            if (kind[j] == 2) {
                ((int64_t *)out[j])[2 * k] = ((int64_t *)out[j])[2 * k + 1] = b - data;
            } else {
                ok[j] = 0;
            }
        }
    }
    free(want);
}

/* The bytes data[bounds[2k]:bounds[2k+1]] of n tokens, back to back in buf, with their offsets. */
void gather(const uint8_t *data, const int64_t *bounds, int64_t n, int64_t *offsets, uint8_t *buf) {
    int64_t used = 0;
    offsets[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t len = bounds[2 * k + 1] - bounds[2 * k];
        memcpy(buf + used, data + bounds[2 * k], len);
        used += len;
        offsets[k + 1] = used;
    }
}
