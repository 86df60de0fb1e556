r"""Client-level differential privacy for the shared uploads: DP-FedAvg.

The mechanism of McMahan, Ramage, Talwar and Zhang, "Learning Differentially
Private Recurrent Language Models", ICLR 2018 (DP-FedAvg), with the clipping
norm optionally tuned by Andrew, Thakkar, McMahan and Ramaswamy,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021.

Neighbouring datasets differ by adding or removing one client with all of its
data (client-level DP). One round, as :class:`~fedrecgel_secure.federation.dp_aggregation.DPFedAvg` runs it:

1. sample clients independently with probability :math:`q` (Poisson), the
   expected number being :math:`m = qN`;
2. every sampled client clips its upload (the full shared vector) to L2 norm :math:`C`;
3. Gaussian noise of std :math:`zC` is added to the sum of the clipped uploads,
   by the server (``central``) or as shares of std :math:`zC/\sqrt{|S|}` added
   by the :math:`|S|` sampled clients before secure aggregation (``distributed``);
4. the aggregate is the noisy sum divided by the fixed :math:`m`;
5. the accountant takes one step with the noise multiplier that actually reached
   the sum (shares of clients that dropped out leave with them).

The package is split by concern, like Opacus's ``accountants`` over its ``analysis``:

* :mod:`.gaussian`: clipping, noise stds, the fixed denominator (pure maths);
* :mod:`.client_sampling`: Poisson sampling and cyclic participation (pure maths);
* :mod:`.randomness`: where the sample and the noise come from (a keyed CSPRNG);
* :mod:`.accountants`: the accountant registry, one entry per kind a policy may name (what computes it);
* :mod:`.accounting`: the accountant of the released models and calibration;
* :mod:`.opacus_analysis`: Opacus's RDP, PRV and GDP analyses, the only module that imports opacus;
* :mod:`.pld`: privacy loss distributions (the default accountant), the only module that imports dp-accounting;
* :mod:`.observers`: epsilon against the server, from a per-user record of the rounds it saw;
* :mod:`.adaptive`: adaptive clipping (Andrew et al. 2021);
* :mod:`.resolution`: the policy's settings checked against the federation.

The settings themselves are pydantic models in :mod:`fedrecgel_secure.policy.dp`.
Importing this package imports none of the submodules, so reading a policy
never loads torch or opacus.
"""
