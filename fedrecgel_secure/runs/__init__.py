"""A run's directory and what lives in it, in one package that knows no training
(:mod:`fedrecgel_secure.federation.runner` trains into one):

* :mod:`.directory`: the names of a run directory's files, how they are written (atomically, 0600 where private)
  and what ``summary.json`` holds;
* :mod:`.checkpoint`: torch's serialisation of a run's state, written atomically with mode 0600;
* :mod:`.index`: the run directories under a root, read without torch (``fedrecgel runs``).
"""
