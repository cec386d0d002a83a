"""Tuning on a Ray cluster (``altenv tune --ray ADDRESS|local``): builds as Ray tasks over
the cluster's CPUs, one Ray actor per measuring device (:mod:`.measurer`), joined by
:mod:`.session`. :mod:`.settings` (the ``ray:`` section of a run config) imports no Ray;
only a run that names ``ray:`` imports the rest, so nothing else in altenv needs Ray."""
