"""FedCBO paper, §2.4 Table 1 and the JMLR version's Appendix E Table 2.

``fedcbo-table1``: rotated MNIST with 4 rotations; FedCBO, IFCA, FedAvg and Local
training, mean test accuracy over agents (%), averaged over seeds.
``fedcbo-noise``: FedCBO with the Appendix E aggregation noise (none; isotropic and
anisotropic, σ1 = 0.01 and 0.05), eq. (70) read two ways. As written, the noise's time
step is the aggregation's γ = 0.1; an isotropic step multiplies E|θ - m|² by
``(1 - λ1γ)² + σ1² γ d`` with ``d = 159,010`` parameters: 1.59 at σ1 = 0.01, so the
spread grows every round and the run collapses, which cannot give the paper's 96.41. The
only reading that fits all four published rows is a smaller noise time step
(``FedCBOConfig.noise_gamma``), here γ_noise = 0.01, chosen because it fits those rows: the
FedCBO reference script gives no value for it. Its runs pass ``--Gamma 0.98 --Sigma 0`` and
add no noise at all; 0.01 is only the default of its ``--Gamma`` argument. Both
readings are run, and isotropic σ1 = 0.005, 0.0079, 0.01 at γ = 0.1 show the predicted
threshold 1/√(γ d) ≈ 0.0079.

Presets: ``--preset paper`` (the default) builds the data as the paper describes it;
``--preset reference-script`` follows the FedCBO reference script where the paper is
silent: one 6,000-image subset of the training set, shared by all rotations, from which
every agent draws its 200 images with replacement (accuracy is measured after each round's
aggregation, on the full rotated test set, in both presets).

Baseline protocols (``--baselines``): the paper gives IFCA and FedAvg one sentence each and
says every method ran τ epochs of mini-batch SGD with momentum 0.9 (``paper``, the default:
the same :class:`~cbo_jax.federated.local.LocalSGDConfig` as FedCBO). ``ifca-code`` gives IFCA
and FedAvg the local update of IFCA's own MNIST code (Ghosh et al.'s repository,
``mnist/train_cluster_mnist.py``): ``tau = 10`` full-batch gradient steps at lr 0.1, no
momentum, at either scale (:data:`IFCA_CODE_LOCAL`); everything else is unchanged. Both
readings agree on the rest: every agent takes part in every round, the ``k`` server models
are initialised independently at random, and at inference each test set uses the server
model with the smallest loss on it (IFCA's code assigns its test machines by their own
loss; the FedCBO paper: "the one with the smallest loss").

Scales:

* small: N = 120 agents of 200 images, M = 20, τ = 5 epochs, T = 40 rounds, 3 seeds
  (real MNIST: set CBO_JAX_DATA_DIR, or --source bundled for the shipped subset).
* paper: N = 1200, M = 200, τ = 10, T = 100, full test sets (a GPU-sized run).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from cbo_jax.config import option
from cbo_jax.experiments.base import Experiment, MNISTOptions, ScaleOptions
from cbo_jax.experiments.federated import RotatedMNISTConfig, RunOptions, comparison, load_data, replace, run_experiment
from cbo_jax.federated.algorithms import FedAvgConfig, FedCBOConfig, IFCAConfig
from cbo_jax.federated.local import LocalSGDConfig

PUBLISHED = {"fedcbo": 96.51, "ifca": 94.44, "fedavg": 85.50, "local": 81.27}
PUBLISHED_NOISE = {"no_noise": 96.51, "iso_0.01": 96.41, "iso_0.05": 10.49, "aniso_0.01": 96.33, "aniso_0.05": 96.34}

@dataclasses.dataclass(frozen=True)
class Scale:
    agents: int
    M: int
    epochs: int
    rounds: int
    eval_chunk: int
    seeds: int
    samples_per_agent: int = 200
    eval_every: int = 10


SCALES = {
    "small": Scale(agents=120, M=20, epochs=5, rounds=40, eval_chunk=8, seeds=3),
    "paper": Scale(agents=1200, M=200, epochs=10, rounds=100, eval_chunk=4, seeds=1),
}


BASELINES = ("paper", "ifca-code")


def ifca_code_local(samples_per_agent: int) -> LocalSGDConfig:
    """IFCA's own MNIST local update: ``tau = 10`` gradient steps on the whole local data set
    (one batch of ``samples_per_agent`` images per step) at lr 0.1, plain gradient descent."""
    return LocalSGDConfig(epochs=10, batch_size=samples_per_agent, lr=0.1, momentum=0.0)


@dataclasses.dataclass(frozen=True)
class Options:
    """The options of ``fedcbo-table1`` and ``fedcbo-noise``.

    Attributes:
      scale: the scale (:data:`SCALES`), seeds and rounds (:class:`~cbo_jax.experiments.base.ScaleOptions`)
      data: where MNIST is read (:class:`~cbo_jax.experiments.base.MNISTOptions`)
      preset: data protocol: the paper's partition, or the reference script's 6,000-image
        subset shared by the rotations, sampled with replacement
      baselines: IFCA's and FedAvg's local update: paper (τ epochs of SGD with momentum, as
        FedCBO) or ifca-code (IFCA's own code: 10 full-batch gradient steps at lr 0.1, no momentum)
    """

    scale: ScaleOptions = ScaleOptions()
    data: MNISTOptions = MNISTOptions()
    preset: str = option("paper", choices=("paper", "reference-script"))
    baselines: str = option("paper", choices=BASELINES)


def _configs(args) -> tuple[dict, int]:
    """The four methods' experiment configs at the chosen scale, and the number of seeds."""
    s = SCALES[args.scale]
    rounds = s.rounds if args.rounds is None else args.rounds
    data = RotatedMNISTConfig(source=args.source, data_dir=args.data_dir, agents=s.agents,
                              samples_per_agent=s.samples_per_agent,
                              subset=6000 if getattr(args, "preset", "paper") == "reference-script" else None)
    run = RunOptions(rounds=rounds, eval_every=min(s.eval_every, rounds))
    configs = comparison(data, LocalSGDConfig(epochs=s.epochs), run, FedCBOConfig(M=s.M, eval_chunk=s.eval_chunk))
    if getattr(args, "baselines", "paper") == "ifca-code":
        local = ifca_code_local(s.samples_per_agent)
        configs["ifca"] = dataclasses.replace(configs["ifca"], config=IFCAConfig(k=data.clusters, local=local))
        configs["fedavg"] = dataclasses.replace(configs["fedavg"], config=FedAvgConfig(local=local))
    return configs, (s.seeds if args.seeds is None else args.seeds)


def _sweep(variants: dict, seeds: int, args) -> dict:
    out_root = args.output or None
    results = {}
    total = seeds * len(variants)
    for seed in range(seeds):
        first = next(iter(variants.values()))
        data = load_data(dataclasses.replace(first.data, seed=seed))
        for i, (name, cfg) in enumerate(variants.items()):
            out = (out_root / name / f"seed{seed}") if out_root else None
            if not args.no_progress:  # which of the runs this is: a long reproduction is many runs
                print(f"[{seed * len(variants) + i + 1}/{total}] {name}, seed {seed}" + (f": {out}" if out else ""),
                      flush=True)
            cfg = replace(cfg, **{"run.seed": seed, "data.seed": seed,
                                  "run.checkpoint_every": getattr(args, "checkpoint_every", None)})
            res = run_experiment(cfg, out, progress=not args.no_progress, data=data,
                                 resume=bool(getattr(args, "resume", False)) and out is not None)
            results.setdefault(name, []).append(res.summary)
    return results


def _mean_std(vals):
    return round(float(np.mean(vals)), 2), round(float(np.std(vals)), 2)


def run_table1(args: argparse.Namespace) -> dict:
    variants, seeds = _configs(args)
    results = _sweep(variants, seeds, args)
    base = variants["fedcbo"]
    out = {"experiment": "fedcbo-table1", "scale": args.scale, "preset": args.preset,
           "baselines": getattr(args, "baselines", "paper"), "seeds": seeds,
           "agents": base.data.agents,
           "M": base.config.M, "rounds": base.run.rounds, "epochs": base.config.local.epochs, "published": PUBLISHED}
    for name, runs in results.items():
        out[name], out[f"{name}_std"] = _mean_std([r["final_test_acc"] for r in runs])
    out["sr_final"] = round(float(np.mean([r["final_sr"] for r in results["fedcbo"]])), 4)
    out["sr_oracle_final"] = round(float(np.mean([r["final_sr_oracle"] for r in results["fedcbo"]])), 4)
    out["ordering_as_paper"] = bool(out["fedcbo"] > out["ifca"] > out["fedavg"] > out["local"])
    return out


NOISE_GAMMA = 0.01  # fits the four published rows; not a value the reference script runs (module docstring)
THRESHOLD_SIGMAS = (0.005, 0.0079, 0.01)  # around 1/sqrt(γ d) = 0.0079 for γ = 0.1, d = 159,010


def run_noise(args: argparse.Namespace) -> dict:
    """Appendix E, eq. (70), read two ways: as written (noise time step γ_noise = γ = 0.1) and
    with γ_noise = 0.01 (the reading that fits the published rows; the reference script runs
    without noise); and isotropic σ1 around the
    stability threshold 1/√(γ d) of the reading as written (module docstring, RESULTS.md)."""
    if getattr(args, "baselines", "paper") != "paper":
        raise ValueError("fedcbo-noise runs FedCBO only: --baselines chooses IFCA's and FedAvg's local update in "
                         "fedcbo-table1")
    configs, seeds = _configs(args)
    base = configs["fedcbo"]
    variants = {"no_noise": base}
    for kind, short in (("isotropic", "iso"), ("anisotropic", "aniso")):
        for s in (0.01, 0.05):
            variants[f"{short}_{s}"] = replace(base, **{"config.noise": kind, "config.sigma1": s})
            variants[f"{short}_{s}_gn{NOISE_GAMMA}"] = replace(
                base, **{"config.noise": kind, "config.sigma1": s, "config.noise_gamma": NOISE_GAMMA})
    for s in THRESHOLD_SIGMAS:
        if s != 0.01:  # 0.01 is iso_0.01 above
            variants[f"iso_{s}"] = replace(base, **{"config.noise": "isotropic", "config.sigma1": s})
    results = _sweep(variants, seeds, args)
    out = {"experiment": "fedcbo-noise", "scale": args.scale, "preset": args.preset, "seeds": seeds,
           "rounds": base.run.rounds,
           "gamma": base.config.gamma, "noise_gamma": NOISE_GAMMA, "published": PUBLISHED_NOISE}
    for name, runs in results.items():
        if name.startswith("iso_") and float(name.split("_")[1]) not in (0.01, 0.05):
            continue
        out[name], out[f"{name}_std"] = _mean_std([r["final_test_acc"] for r in runs])
    # Without noise, γ_noise changes nothing: the same run.
    out[f"no_noise_gn{NOISE_GAMMA}"], out[f"no_noise_gn{NOISE_GAMMA}_std"] = out["no_noise"], out["no_noise_std"]
    out["threshold_sweep"] = {str(s): _mean_std([r["final_test_acc"] for r in results[f"iso_{s}"]])[0]
                              for s in THRESHOLD_SIGMAS}
    out["threshold_sigma1"] = round(1 / (base.config.gamma * P_MLP) ** 0.5, 5)
    return out


P_MLP = 784 * 200 + 200 + 200 * 10 + 10  # parameters d of the MLP 784-200-10


TABLE1 = Experiment(
    name="fedcbo-table1",
    summary="FedCBO vs IFCA, FedAvg, Local on rotated MNIST (4 rotations); --scale small|paper; "
            "--baselines paper|ifca-code (IFCA's and FedAvg's local update)",
    published="FedCBO 96.51, IFCA 94.44, FedAvg 85.50, Local 81.27 (N=1200, M=200, T=100)",
    options=Options,
    run=run_table1,
    resumable=True,
)

NOISE = Experiment(
    name="fedcbo-noise",
    summary="FedCBO with Appendix E aggregation noise (iso/aniso, sigma1 0.01/0.05), as written and with "
            "noise_gamma=0.01, and an isotropic sigma1 sweep at the stability threshold; --scale small|paper",
    published="none 96.51, iso 0.01 96.41, iso 0.05 10.49 (collapse), aniso 0.01 96.33, aniso 0.05 96.34",
    options=Options,
    run=run_noise,
    resumable=True,
)
