"""The classic-control study (the paper's Figure "DQN ... under various buffer sizes"): final return against
replay-buffer size, per environment and activation, at each setting's best learning rate; aggregate statistics across
tasks (rliable); and a comparison with the authors' published per-task results.

    python -m reports.classic RUNS_DIR [MORE ...] -o OUT/ [--reps 2000] [--seed 0]

Runs are grouped by their whole config except the seed; groups that differ only in the learning rate are one
setting. Final return = mean episode return over the last 10% of a run's episodes (as in the paper); per setting
the learning rate with the highest mean final return over seeds is selected, and the page shows that mean ±
standard error over seeds (std with ddof=1 / sqrt(n)), with the learning rates it was chosen from (the page says
where those sets differ between points: a wider search favours its points). Runs that did not finish
(interrupted, diverged, still being written; for other tools' logs without a ``run_end`` series, last record short
of ``n_timesteps``), runs with a non-finite final return, and repeats of a config and seed are left out with a
warning on stderr, counted on the page; a learning rate some of whose runs were left out is still tried but only
selectable if it has as many usable seeds as the point's best-covered one (the page names those that were not).

Aggregates across tasks (Agarwal et al. 2021, computed by rliable): per activation and buffer size, each seed's final
return at the selected learning rate is normalised per task as ``(R - R_random) / (R_ref - R_random)``, with
``R_random`` the mean return of a uniform-random policy and ``R_ref`` the best mean final return among the authors'
activations at their default buffer (constants and sources in ``reports/reference/classic_dqn.json``); 0 is random,
about 1 the authors' best (R_ref is their late return, episodes ending in the last 10% of steps, where R is ours over
the last 10% of episodes; the two differ little on a converged curve). The learning rate is selected on the same
seeds it is scored on, so the aggregates lean optimistic by the selection (the paper's procedure too). IQM and
mean over tasks x seeds come with stratified-bootstrap 95% CIs (``--reps`` resamples, numpy seeded with ``--seed``),
and performance profiles (fraction of runs scoring above tau) per buffer.

Besides the page (``index.html``) and its figures, ``OUT`` gets the numbers as CSV: ``points.csv`` (each point, its
seeds' final returns and the learning rates searched), ``runs.csv`` (every usable run at every learning rate) and
``aggregates.csv`` (IQM and mean with their CIs).

The comparison with the authors uses their per-episode training returns (``results/DQN_*.csv`` of qlan3/Elephant,
at their default buffer 1e4) and ours at the same buffer; there "final" is, on both sides, the mean return of the
episodes that ended in the last 10% of the run's steps (the authors' files are read only at their ends).
"""

from .data import REFERENCE, ClassicRow, Comparison, authors_comparison, classic_table, late_return, reference_data
from .page import main
from .plots import aggregate_figure, buffer_figure, profile_figure
from .scores import REPS, Aggregate, Profiles, aggregates, normalise, performance_profiles, score_matrices

__all__ = ["ClassicRow", "classic_table", "buffer_figure", "REFERENCE", "reference_data", "normalise",
           "score_matrices", "Aggregate", "aggregates", "Profiles", "performance_profiles", "aggregate_figure",
           "profile_figure", "late_return", "Comparison", "authors_comparison", "main"]
