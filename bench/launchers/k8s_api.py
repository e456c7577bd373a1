"""The Kubernetes API as the launcher talks to it: the client configured from a kubeconfig (in a pod, from
its service account), and every failed call in one line that names its cause.

The official client raises an ApiException whose str() is the HTTP status, the response's headers and its
raw JSON body; a server it cannot reach surfaces as urllib3's MaxRetryError, its cause (Connection refused)
at the end of a long line. `Api` wraps each of the client's API objects so that both arrive as ApiError: the
status kept (404: gone), the text '<status> <reason>: <what it means>: <the server's message>' or 'the
Kubernetes API at <host> is not reachable: <cause>'. A kubeconfig that turns TLS verification off
(insecure-skip-tls-verify) makes urllib3 warn of every request, in two lines: it is said once, at connection.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import ssl
import sys
import warnings
from collections.abc import Callable
from typing import Any

from bench.core.config import ConfigError

# What an HTTP status of the API server means to the person running the study
MEANINGS = {401: "the API server refused the credentials (the kubeconfig's token or client certificate is "
                 "wrong or has expired)",
            403: "permission denied by the cluster's RBAC"}
DEFAULT_KUBECONFIG = "~/.kube/config"  # where kubectl and the client look without $KUBECONFIG


class ApiError(Exception):
    """A call the API server answered with an error (its HTTP status), or one that never reached it (None)."""

    def __init__(self, status: int | None, text: str) -> None:
        super().__init__(text)
        self.status = status


def server_message(body: Any) -> str | None:
    """The message of the Status object the API server answers an error with, else the body's first line."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    if not text or not text.strip():
        return None
    try:
        status = json.loads(text)
    except ValueError:
        return text.strip().splitlines()[0][:300]
    return status.get("message") if isinstance(status, dict) else None


def answered(e: Any) -> ApiError:
    """An ApiException in one line: '<status> <reason>[: what it means][: the server's message]'."""
    said = server_message(e.body)
    parts = [f"{e.status} {e.reason or ''}".strip(), MEANINGS.get(e.status),
             said if said != e.reason else None]
    return ApiError(e.status, ": ".join(p for p in parts if p))


def cause(e: BaseException) -> str:
    """A failed connection's innermost cause in its own words ('Connection refused', a certificate's verdict,
    'timed out'): urllib3 wraps it as MaxRetryError -> NewConnectionError -> OSError."""
    seen: set[int] = set()
    while id(e) not in seen:
        seen.add(id(e))
        reason = getattr(e, "reason", None)
        inner = reason if isinstance(reason, BaseException) else e.__cause__ or e.__context__
        if inner is None:
            break
        e = inner
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate is not trusted ({e.verify_message})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class Api:
    """One of the client's API objects (CoreV1Api, CustomObjectsApi ...), each call's failure an ApiError."""

    def __init__(self, api: Any, server: str) -> None:
        self._api, self._server = api, server

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return functools.partial(_call, getattr(self._api, name), self._server)


def _call(method: Callable[..., Any], server: str, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError
    try:
        return method(*args, **kwargs)
    except ApiException as e:
        raise answered(e) from None
    except HTTPError as e:
        where = f" at {server}" if server else ""
        raise ApiError(None, f"the Kubernetes API{where} is not reachable: {cause(e)}") from None


def kubeconfig_path(setting: str | None) -> tuple[str, str]:
    """The kubeconfig file(s) to read (a path list, as $KUBECONFIG may be), and where that came from."""
    if setting:
        return setting, "launcher.kubernetes.kubeconfig"
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"], "$KUBECONFIG"
    return DEFAULT_KUBECONFIG, "the default"


def no_config(path: str, source: str, e: Exception) -> str:
    """Why no configuration was found, naming the file(s) tried."""
    files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
    where = ", ".join(files)
    found = any(os.path.exists(f) for f in files)
    why = f"kubeconfig {where} ({source}): {e}" if found else f"no kubeconfig at {where} ({source})"
    return (f"no Kubernetes configuration: {why}, and not in a pod of a cluster; set KUBECONFIG or "
            "launcher.kubernetes.kubeconfig, or preview with --dry-run")


def load_config(kubeconfig: str | None, context: str | None) -> str:
    """Configure the client from the kubeconfig (launcher.kubernetes.kubeconfig, else $KUBECONFIG, else
    ~/.kube/config), else, in a pod, from its service account; returns the API server's address."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    path, source = kubeconfig_path(kubeconfig)
    try:
        config.load_kube_config(config_file=path, context=context)
    except (ConfigException, OSError, TypeError) as e:
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ConfigError(no_config(path, source, e)) from None
    # urllib3 retries a failed connection three times, logging each at WARNING, which Python prints to
    # stderr where nothing configured logging: the call's one ApiError says it once
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    settings = client.Configuration.get_default_copy()
    if not settings.verify_ssl:
        say_unverified(settings.host)
    return str(settings.host)


def say_unverified(host: str) -> None:
    """TLS verification is off: said once, here, where urllib3 would warn of every request in two lines."""
    from urllib3.exceptions import InsecureRequestWarning
    warnings.filterwarnings("ignore", category=InsecureRequestWarning)
    print(f"warning: TLS verification is off for the Kubernetes API at {host} (insecure-skip-tls-verify in "
          "the kubeconfig): the server's identity is not checked", file=sys.stderr)
