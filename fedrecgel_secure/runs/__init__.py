"""A run's directory and what lives in it, in one package:

* :mod:`.directory`: the names of a run directory's files, how they are written (atomically, 0600 where private)
  and what ``summary.json`` holds;
* :mod:`.checkpoint`: torch's serialisation of a run's state, written atomically with mode 0600;
* :mod:`.runner`: start a run, resume it after a crash, evaluate what it saved;
* :mod:`.index`: the run directories under a root, read without torch (``fedrecgel runs``).
"""
