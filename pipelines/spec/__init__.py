"""Experiment specs: the schema (:mod:`.experiment`), the ``algorithm`` section derived from
the registries (:mod:`.algorithms`), the task section (:mod:`.tasks`), YAML files and
overrides (:mod:`.files`), one-line errors (:mod:`.errors`), plugins (:mod:`.plugins`) and
the memory estimate that refuses sizes which cannot fit (:mod:`.memory`)."""

from pipelines.spec.experiment import *  # noqa: F403  (the schema's public names)
from pipelines.spec.experiment import __all__ as __all__
