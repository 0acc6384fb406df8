"""Running one experiment: build the runtime from a spec and track it (:mod:`.experiment`),
the run-state checkpoints beside the store (:mod:`.checkpoint_store`), signals and
processes (:mod:`.processes`), the warm start (:mod:`.warmstart`) and the chat-model builder
(:mod:`.chatmodel`)."""

from pipelines.run.experiment import *  # noqa: F403  (run_experiment and its helpers)
from pipelines.run.experiment import __all__ as __all__
