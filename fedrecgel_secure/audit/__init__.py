"""The privacy audit: an application over runs, like :mod:`fedrecgel_secure.study`.

* :mod:`.metrics`: AUC, precision@k and the popularity prior (numpy only);
* :mod:`.views`: what the server observes of a client under each policy;
* :mod:`.attacks`: interaction-inference attacks on a view (norm, touched rows
  then the prior, IMIA);
* :mod:`.canaries` and :mod:`.estimate`: canary clients and the one-run
  empirical ε (Andrew et al., ICLR 2024);
* :mod:`.run`: audit a trainer or a run directory, write ``audit.json``.

Nothing in :mod:`fedrecgel_secure.federation` or :mod:`fedrecgel_secure.privacy`
imports this package except the trainer, which attaches canaries when the
policy asks for them.
"""
