from trainer.emit import exit_now
from trainer.main import main

exit_now(main())
