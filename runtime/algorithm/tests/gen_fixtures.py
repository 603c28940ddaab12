#!/usr/bin/env python3
"""Generate the reference fixtures in tests/fixtures/ by running Trinity-RFT's own algorithm code.

Usage: gen_fixtures.py TRINITY_SRC [OUT_DIR]

TRINITY_SRC is a directory holding Trinity-RFT's `trinity/` package (e.g. the unpacked `trinity-rft` wheel:
`pip download --no-deps trinity-rft && unzip trinity_rft-*.whl`). Only the algorithm modules are imported;
their heavy imports (verl, ray, omegaconf, the buffer) are replaced by small stubs, so plain `torch` and `numpy`
suffice. Each fixture case is an input of `trinity algorithm eval` and the output Trinity-RFT's functions
produce for it, composed the way Trinity-RFT's trainer composes them (`trainer/verl/losses.py`,
`trainer/verl/trainer.py`), restated in `trinity_eval` below.
"""

import copy
import importlib
import json
import logging
import math
import os
import random
import sys
import types

import numpy as np
import torch

SRC = sys.argv[1] if len(sys.argv) > 1 else None
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
if SRC is None:
    sys.exit(__doc__)


# --- stubs for the heavy imports -----------------------------------------------------------------------------


def stub_package(name):
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(SRC, *name.split("."))]
    sys.modules[name] = module
    return module


for pkg in [
    "trinity",
    "trinity.algorithm",
    "trinity.algorithm.advantage_fn",
    "trinity.algorithm.policy_loss_fn",
    "trinity.algorithm.kl_fn",
    "trinity.algorithm.entropy_loss_fn",
    "trinity.common",
    "trinity.utils",
    "trinity.buffer",
]:
    stub_package(pkg)

dataclass_utils = types.ModuleType("trinity.common.dataclass_utils")
dataclass_utils.build_dataclass_from_mapping = lambda *a, **k: None
sys.modules["trinity.common.dataclass_utils"] = dataclass_utils

operators = types.ModuleType("trinity.buffer.operators")


class ExperienceOperator:
    pass


operators.ExperienceOperator = ExperienceOperator
sys.modules["trinity.buffer.operators"] = operators

log = types.ModuleType("trinity.utils.log")
log.get_logger = lambda name=None, *a, **k: logging.getLogger(name)
sys.modules["trinity.utils.log"] = log


class DataProto:
    def __init__(self, batch, non_tensor_batch):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch


class TensorBatch(dict):
    """veRL's TensorDict, as far as the KL penalty reads it."""

    @property
    def batch_size(self):
        return [next(iter(self.values())).shape[0]]


verl = types.ModuleType("verl")
verl.DataProto = DataProto
sys.modules["verl"] = verl

M = importlib.import_module
adv_base = M("trinity.algorithm.advantage_fn.advantage_fn")
sys.modules["trinity.algorithm.advantage_fn"].AdvantageFn = adv_base.AdvantageFn
sys.modules["trinity.algorithm.advantage_fn"].GroupAdvantage = adv_base.GroupAdvantage
experience = M("trinity.common.experience")
utils = M("trinity.algorithm.utils")

ADV = {
    "ppo": M("trinity.algorithm.advantage_fn.ppo_advantage").PPOAdvantageFn,
    "grpo": M("trinity.algorithm.advantage_fn.grpo_advantage").GRPOGroupedAdvantage,
    "grpo_verl": M("trinity.algorithm.advantage_fn.grpo_advantage").GRPOAdvantageFn,
    "step_wise_grpo": M("trinity.algorithm.advantage_fn.multi_step_grpo_advantage").StepWiseGRPOAdvantageFn,
    "reinforceplusplus": M(
        "trinity.algorithm.advantage_fn.reinforce_plus_plus_advantage"
    ).REINFORCEPLUSPLUSAdvantageFn,
    "reinforce": M("trinity.algorithm.advantage_fn.reinforce_advantage").REINFORCEGroupAdvantage,
    "remax": M("trinity.algorithm.advantage_fn.remax_advantage").REMAXAdvantageFn,
    "rloo": M("trinity.algorithm.advantage_fn.rloo_advantage").RLOOAdvantageFn,
    "opmd": M("trinity.algorithm.advantage_fn.opmd_advantage").OPMDGroupAdvantage,
    "opmd_verl": M("trinity.algorithm.advantage_fn.opmd_advantage").OPMDAdvantageFn,
    "asymre": M("trinity.algorithm.advantage_fn.asymre_advantage").ASYMREGroupAdvantage,
    "asymre_verl": M("trinity.algorithm.advantage_fn.asymre_advantage").ASYMREAdvantageFn,
    "rec": M("trinity.algorithm.advantage_fn.rec_advantage").RECGroupedAdvantage,
    "on_policy_distill": M("trinity.algorithm.advantage_fn.on_policy_distill_advantage").OnPolicyDistillAdvantage,
    "jsd": M("trinity.algorithm.advantage_fn.jsd_advantage").JSDAdvantage,
}
chord = M("trinity.algorithm.policy_loss_fn.chord_policy_loss")
POLICY = {
    "ppo": M("trinity.algorithm.policy_loss_fn.ppo_policy_loss").PPOPolicyLossFn,
    "opmd": M("trinity.algorithm.policy_loss_fn.opmd_policy_loss").OPMDPolicyLossFn,
    "dpo": M("trinity.algorithm.policy_loss_fn.dpo_loss").DPOLossFn,
    "sft": M("trinity.algorithm.policy_loss_fn.sft_loss").SFTLossFn,
    "mix": M("trinity.algorithm.policy_loss_fn.mix_policy_loss").MIXPolicyLossFn,
    "gspo": M("trinity.algorithm.policy_loss_fn.gspo_policy_loss").GSPOLossFn,
    "topr": M("trinity.algorithm.policy_loss_fn.topr_policy_loss").TOPRPolicyLossFn,
    "cispo": M("trinity.algorithm.policy_loss_fn.cispo_policy_loss").CISPOPolicyLossFn,
    "sft_is": chord.SFTISLossFn,
    "sft_phi": chord.SFTPhiLossFn,
    "mix_chord": chord.MIXCHORDPolicyLossFn,
    "sppo": M("trinity.algorithm.policy_loss_fn.sppo_loss_fn").sPPOPolicyLossFn,
    "rec": M("trinity.algorithm.policy_loss_fn.rec_policy_loss").RECPolicyLossFn,
    "sapo": M("trinity.algorithm.policy_loss_fn.sapo_policy_loss").SAPOPolicyLossFn,
    "importance_sampling": M(
        "trinity.algorithm.policy_loss_fn.importance_sampling_policy_loss"
    ).ImportanceSamplingLossFn,
}
klm = M("trinity.algorithm.kl_fn.kl_fn")
KL = {
    "none": klm.DummyKLFn,
    "k1": klm.K1Fn,
    "k2": klm.K2Fn,
    "k3": klm.K3Fn,
    "low_var_kl": klm.LowVarKLFn,
    "abs": klm.AbsFn,
    "corrected_k3": klm.CorrectedK3Fn,
}
entm = M("trinity.algorithm.entropy_loss_fn.entropy_loss_fn")
ENTROPY = {"default": entm.DefaultEntropyLossFn, "mix": entm.MixEntropyLossFn, "none": entm.DummyEntropyLossFn}


# --- the trainer step, restated ------------------------------------------------------------------------------


def merged_args(cls, user):
    args = dict(cls.default_args())
    for k, v in (user or {}).items():
        if v is not None:
            args[k] = v
    return args


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def token_level_scores(batch):
    if "token_level_rewards" in batch:
        return t(batch["token_level_rewards"])
    mask = batch["action_mask"]
    scores = torch.zeros(len(mask), len(mask[0]), dtype=torch.float32)
    for i, row in enumerate(mask):
        valid = [j for j, m in enumerate(row) if m]
        if valid:
            scores[i, valid[-1]] = torch.tensor(batch["reward"][i], dtype=torch.float32)
    return scores


def group_advantage(fn, batch):
    """Runs an explorer-side advantage on Experience objects; returns (adv, returns, rows, metrics)."""
    n, length = len(batch["action_mask"]), len(batch["action_mask"][0])
    rewards = batch.get("reward")
    if rewards is None:
        rewards = [float(sum(r)) for r in batch["token_level_rewards"]]
    exps = []
    for i in range(n):
        # An Experience holds its response unpadded: up to the last action token.
        valid = [j for j, m in enumerate(batch["action_mask"][i]) if m]
        resp = valid[-1] + 1 if valid else length
        eid = experience.EID(batch="0", task=str(batch["group_id"][i]), run=str(batch.get("run_id", [0] * n)[i]))
        logprobs = batch["old_logprob"][i] if "old_logprob" in batch else [0.0] * length
        exps.append(
            experience.Experience(
                eid=eid,
                tokens=[0] * (resp + 1),
                prompt_length=1,
                logprobs=logprobs[:resp],
                reward=rewards[i],
                action_mask=[bool(m) for m in batch["action_mask"][i][:resp]],
                info={"row": i},
            )
        )
    out, metrics = fn(exps)
    adv = torch.zeros(n, length)
    ret = torch.zeros(n, length)
    rows = []
    for e in out:
        row = e.info["row"]
        rows.append(row)
        adv[row, : e.advantages.shape[0]] = e.advantages.float()
        ret[row, : e.returns.shape[0]] = e.returns.float()
    return adv, ret, rows, metrics


def trainer_batch(batch, scores):
    mask = t(batch["action_mask"])
    tb = TensorBatch(token_level_rewards=scores, token_level_scores=scores, response_mask=mask)
    tb["responses"] = torch.zeros_like(mask)
    tb["attention_mask"] = torch.ones_like(mask)
    for ours, theirs in [
        ("old_logprob", "old_log_probs"),
        ("ref_logprob", "ref_log_prob"),
        ("values", "values"),
        ("teacher_logprob", "teacher_logprobs"),
    ]:
        if ours in batch:
            tb[theirs] = t(batch[ours])
    if "reward_baselines" in batch:
        tb["reward_baselines"] = torch.tensor(batch["reward_baselines"], dtype=torch.float32)
    uid = np.array([str(g) for g in batch.get("group_id", [0] * len(batch["action_mask"]))])
    return DataProto(tb, {"uid": uid})


def dpo_per_pair(fn, logprob, ref, mask):
    """Trinity-RFT's DPO is exact for one pair per micro-batch; the fixed loss is the mean over pairs."""
    losses, metrics = [], []
    for k in range(0, logprob.shape[0], 2):
        loss, m = fn(logprob=logprob[k : k + 2], ref_logprob=ref[k : k + 2], action_mask=mask[k : k + 2])
        losses.append(loss)
        metrics.append(m)
    loss = torch.stack(losses).mean()
    return loss, {key: float(np.mean([m[key] for m in metrics])) for key in metrics[0]}


def trinity_eval(inp):
    batch = inp["batch"]
    mask_bool = t(batch["action_mask"]).bool()
    out = {"metrics": {}}
    metrics = out["metrics"]
    logprob = t(batch["logprob"]).requires_grad_(True) if "logprob" in batch else None

    agg = inp.get("loss_agg_mode") or "token-mean"
    advantages, returns, rows = None, None, None
    if "advantages" in batch:
        advantages = t(batch["advantages"])
    elif inp.get("advantage_fn"):
        cls = ADV[inp["advantage_fn"]]
        fn = cls(**merged_args(cls, inp.get("advantage_fn_args")))
        if cls.compute_in_trainer():
            scores = token_level_scores(batch) if ("reward" in batch or "token_level_rewards" in batch) else None
            if scores is None:
                scores = torch.zeros(mask_bool.shape)
            dp = trainer_batch(batch, scores)
            pen = inp.get("kl_penalty_fn")
            if pen and pen != "none":
                kcls = KL[pen]
                kfn = kcls(**merged_args(kcls, inp.get("kl_penalty_fn_args")))
                dp, m = kfn.apply_kl_penalty_to_reward(dp)
                metrics.update({f"advantage/{k}": v for k, v in m.items()})
            dp, m = fn(dp)
            metrics.update({f"advantage/{k}": v for k, v in m.items()})
            advantages, returns = dp.batch["advantages"].float(), dp.batch["returns"].float()
        else:
            advantages, returns, rows, m = group_advantage(fn, batch)
            metrics.update(m)
    out["advantages"] = advantages.tolist() if advantages is not None else None
    out["returns"] = returns.tolist() if returns is not None else None

    sel = rows if rows is not None else list(range(len(batch["action_mask"])))
    idx = torch.tensor(sel, dtype=torch.long)

    def pick(name):
        return t(batch[name])[idx] if name in batch else None

    zero = torch.tensor(0.0)
    pg, ent_scaled, ent_raw, kl_scaled, kl_raw = zero, zero, zero, zero, zero
    if len(sel) > 0:
        lp = logprob[idx] if logprob is not None else None
        mask = mask_bool[idx]
        inputs = {
            "old_logprob": pick("old_logprob"),
            "ref_logprob": pick("ref_logprob"),
            "advantages": advantages[idx] if advantages is not None else None,
            "action_mask": mask,
        }
        if "expert_mask" in batch:
            inputs["expert_mask"] = torch.tensor(batch["expert_mask"], dtype=torch.bool)[idx]
        if "step" in batch:
            inputs["step"] = torch.tensor(batch["step"])[idx]
        inputs = {k: v for k, v in inputs.items() if v is not None}
        name = inp.get("policy_loss_fn")
        if name:
            cls = POLICY[name]
            args = merged_args(cls, inp.get("policy_loss_fn_args"))
            if inp.get("loss_agg_mode") and "loss_agg_mode" in args:
                args["loss_agg_mode"] = inp["loss_agg_mode"]
            fn = cls(backend="verl", **args)
            if name == "dpo":
                pg, m = dpo_per_pair(fn, lp, inputs["ref_logprob"], mask)
            else:
                pg, m = fn(logprob=lp, **inputs)
            metrics.update(m)
        ename = inp.get("entropy_loss_fn")
        if ename and ename != "none":
            ecls = ENTROPY[ename]
            eargs = merged_args(ecls, inp.get("entropy_loss_fn_args"))
            if "entropy" in batch or eargs["entropy_coef"] != 0.0:
                efn = ecls(**eargs)
                ent = pick("entropy")
                rest = {k: v for k, v in inputs.items() if k != "action_mask"}
                ent_scaled, m = efn(entropy=ent, action_mask=mask, loss_agg_mode=agg, **rest)
                ent_raw = torch.tensor(m["entropy_loss"])
                metrics.update(m)
        kname = inp.get("kl_loss_fn")
        if kname and kname != "none":
            kcls = KL[kname]
            kargs = merged_args(kcls, inp.get("kl_loss_fn_args"))
            if "ref_logprob" in batch or kargs["kl_coef"] != 0.0:
                kfn = kcls(**kargs)
                kl_scaled, m = kfn.calculate_kl_loss(
                    logprob=lp,
                    ref_logprob=inputs["ref_logprob"],
                    response_mask=mask,
                    loss_agg_mode=agg,
                    old_logprob=inputs.get("old_logprob"),
                )
                kl_raw = torch.tensor(m["kl_loss"])
                metrics.update(m)
    loss = pg - ent_scaled + kl_scaled
    out.update(
        pg_loss=float(pg.detach()),
        kl=float(kl_raw),
        kl_loss=float(kl_scaled.detach()),
        entropy=float(ent_raw),
        entropy_loss=float(ent_scaled.detach()),
        loss=float(loss.detach()),
    )
    if logprob is not None:
        if loss.requires_grad:
            (grad,) = torch.autograd.grad(loss, logprob, allow_unused=True)
            grad = torch.zeros_like(logprob) if grad is None else grad
        else:
            grad = torch.zeros_like(logprob)
        out["grad_logprob"] = grad.tolist()
    else:
        out["grad_logprob"] = None
    return out


# --- random batches ------------------------------------------------------------------------------------------

rng = random.Random(20240601)
AGG = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def r4(x):
    return round(float(x), 4)


def make_batch(rows=None, length=None, groups=None, empty_row=False, reward_kind="float", extra=()):
    rows = rows or rng.randint(3, 6)
    length = length or rng.randint(3, 6)
    mask = []
    for i in range(rows):
        n = rng.randint(1, length)
        mask.append([1] * n + [0] * (length - n))
    if rows > 2 and rng.random() < 0.5:
        mask[1][0] = 0  # an environment token inside the response
    if empty_row:
        mask[-1] = [0] * length
    logprob = [[r4(-abs(rng.gauss(0.8, 0.7))) for _ in range(length)] for _ in range(rows)]
    old = [[r4(lp - rng.gauss(0, 0.35)) for lp in row] for row in logprob]
    ref = [[r4(lp - rng.gauss(0, 0.3)) for lp in row] for row in logprob]
    if groups is None:
        groups = [f"g{i // 2}" for i in range(rows)]
    if reward_kind == "binary":
        reward = [float(rng.random() < 0.5) for _ in range(rows)]
    else:
        reward = [r4(rng.gauss(0.5, 1.0)) for _ in range(rows)]
    b = {
        "group_id": groups[:rows],
        "reward": reward,
        "logprob": logprob,
        "old_logprob": old,
        "ref_logprob": ref,
        "action_mask": mask,
    }
    if "advantages" in extra:
        b["advantages"] = [[r4(rng.gauss(0, 1.2)) for _ in range(length)] for _ in range(rows)]
    if "entropy" in extra:
        b["entropy"] = [[r4(abs(rng.gauss(1.0, 0.5))) for _ in range(length)] for _ in range(rows)]
    if "values" in extra:
        b["values"] = [[r4(rng.gauss(0.2, 0.5)) for _ in range(length)] for _ in range(rows)]
    if "teacher" in extra:
        b["teacher_logprob"] = [[r4(lp - rng.gauss(0, 0.5)) for lp in row] for row in logprob]
    if "token_level_rewards" in extra:
        b["token_level_rewards"] = [[r4(rng.gauss(0, 0.3)) * m for m in row] for row in mask]
    if "expert" in extra:
        b["expert_mask"] = [i % 3 == 0 for i in range(rows)]
    if "step" in extra:
        b["step"] = [7] * rows
    return b


def case(name, **inp):
    try:
        expected = trinity_eval(inp)
    except Exception as exc:  # noqa: BLE001 - recorded so the generator says which case Trinity rejects
        raise RuntimeError(f"case {name}: {exc!r}") from exc
    return {"name": name, "input": inp, "expected": expected}


def write(name, cases):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump({"generated_by": "tests/gen_fixtures.py from Trinity-RFT 0.6.0", "cases": cases}, f)
        f.write("\n")
    print(f"{name}: {len(cases)} cases")


def policy_cases(name, variants, extra=("advantages",), **batch_kw):
    cases = []
    for vi, args in enumerate(variants):
        for agg in AGG:
            b = make_batch(extra=extra, empty_row=(vi % 2 == 1), **batch_kw)
            cases.append(case(f"{name}-{vi}-{agg}", policy_loss_fn=name, policy_loss_fn_args=args, loss_agg_mode=agg, batch=b))
    return cases


def main():
    torch.manual_seed(0)
    # Advantage functions (explorer side and trainer side).
    groups3 = ["a", "a", "a", "b", "b", "c"]
    adv = {
        "grpo": [
            {},
            {"epsilon": 1e-3},
            {"std_threshold": 0.05},
            {"rank_penalty": 0.3},
            {"std_cal_level": "batch"},
            {"std_threshold": 0.0, "std_cal_level": "batch"},
        ],
        "opmd": [{}, {"opmd_baseline": "logavgexp", "tau": 0.7}],
        "asymre": [{}, {"baseline_shift": 0.2}],
        "reinforce": [{}],
        "rec": [{}, {"std_normalize": True}, {"std_normalize": True, "epsilon": 0.01}],
        "grpo_verl": [{}, {"epsilon": 1e-2}],
        "rloo": [{}],
        "opmd_verl": [{}, {"opmd_baseline": "logavgexp", "tau": 2.0}],
        "asymre_verl": [{}, {"baseline_shift": -0.3}],
    }
    for name, variants in adv.items():
        cases = []
        for vi, args in enumerate(variants):
            for kind in ["float", "binary"]:
                groups = ["a", "a", "b", "b", "b", "c"] if name == "rec" else groups3
                rows = 5 if name == "rec" else 6
                b = make_batch(rows=rows, groups=groups, reward_kind=kind)
                if name == "rec":
                    b["group_id"] = ["a", "a", "b", "b", "b"]
                cases.append(case(f"{name}-{vi}-{kind}", advantage_fn=name, advantage_fn_args=args, batch=b))
            b = make_batch(rows=6, groups=groups3, extra=("token_level_rewards",))
            if name in ("rec",):
                continue
            if ADV[name].compute_in_trainer():
                cases.append(case(f"{name}-{vi}-token-rewards", advantage_fn=name, advantage_fn_args=args, batch=b))
        if name in ("grpo_verl", "rloo"):
            b = make_batch(rows=6, groups=groups3)
            cases.append(
                case(f"{name}-kl-penalty", advantage_fn=name, kl_penalty_fn="k3", kl_penalty_fn_args={"kl_coef": 0.2}, batch=b)
            )
        write(f"advantage_{name}", cases)

    # step_wise_grpo: tasks of runs of several steps.
    cases = []
    for vi, args in enumerate(
        [{}, {"enable_step_norm": True}, {"std_cal_level": "batch"}, {"std_threshold": 0.1}, {"epsilon": 0.1}]
    ):
        b = make_batch(rows=9, groups=["t1"] * 5 + ["t2"] * 3 + ["t3"])
        b["run_id"] = ["0", "0", "1", "1", "1", "0", "1", "1", "0"]
        cases.append(case(f"step_wise_grpo-{vi}", advantage_fn="step_wise_grpo", advantage_fn_args=args, batch=b))
    write("advantage_step_wise_grpo", cases)

    cases = []
    for vi, args in enumerate([{}, {"gamma": 0.9, "lam": 0.95}, {"gamma": 0.99, "lam": 0.5}]):
        b = make_batch(extra=("values",))
        cases.append(case(f"ppo-{vi}", advantage_fn="ppo", advantage_fn_args=args, batch=b))
        b = make_batch(extra=("values", "token_level_rewards"))
        cases.append(case(f"ppo-{vi}-token-rewards", advantage_fn="ppo", advantage_fn_args=args, batch=b))
    b = make_batch(extra=("values",))
    cases.append(case("ppo-kl-penalty-k2", advantage_fn="ppo", kl_penalty_fn="k2", kl_penalty_fn_args={"kl_coef": 0.1}, batch=b))
    b = make_batch(extra=("values",))
    cases.append(
        case("ppo-kl-penalty-lowvar", advantage_fn="ppo", kl_penalty_fn="low_var_kl", kl_penalty_fn_args={"kl_coef": 0.05}, batch=b)
    )
    write("advantage_ppo", cases)

    cases = []
    for vi, args in enumerate([{}, {"gamma": 0.9}]):
        cases.append(case(f"rpp-{vi}", advantage_fn="reinforceplusplus", advantage_fn_args=args, batch=make_batch()))
        b = make_batch(extra=("token_level_rewards",))
        cases.append(case(f"rpp-{vi}-token-rewards", advantage_fn="reinforceplusplus", advantage_fn_args=args, batch=b))
    cases.append(
        case("rpp-kl-penalty", advantage_fn="reinforceplusplus", kl_penalty_fn="abs", kl_penalty_fn_args={"kl_coef": 0.3}, batch=make_batch())
    )
    write("advantage_reinforceplusplus", cases)

    cases = []
    for vi in range(2):
        b = make_batch(extra=("token_level_rewards",) if vi else ())
        b["reward_baselines"] = [r4(rng.gauss(0.3, 0.5)) for _ in b["action_mask"]]
        cases.append(case(f"remax-{vi}", advantage_fn="remax", batch=b))
    write("advantage_remax", cases)

    cases = []
    for vi, args in enumerate([{}, {"kl_coef": 0.5}]):
        cases.append(case(f"opd-{vi}", advantage_fn="on_policy_distill", advantage_fn_args=args, batch=make_batch(extra=("teacher",))))
    cases.append(case("opd-one-row", advantage_fn="on_policy_distill", batch=make_batch(rows=1, extra=("teacher",))))
    write("advantage_on_policy_distill", cases)

    cases = []
    for vi, args in enumerate(
        [
            {},
            {"lambda_coef": 0.0},
            {"lambda_coef": 1.0},
            {"lambda_coef": 0.3, "temperature": 0.7, "kl_coef": 2.0},
            {"chunk_size": 3},
        ]
    ):
        cases.append(case(f"jsd-{vi}", advantage_fn="jsd", advantage_fn_args=args, batch=make_batch(extra=("teacher",))))
    write("advantage_jsd", cases)

    # Policy losses.
    write(
        "policy_loss_ppo",
        policy_cases(
            "ppo",
            [
                {},
                {"clip_range_low": 0.1, "clip_range_high": 0.28},
                {"clip_ratio_c": 1.5, "clip_range": 0.1},
                {"enable_sequence_masking": True, "delta_sequence_masking": 0.02},
                {"fallback_to_policy_gradient": True},
            ],
        ),
    )
    write("policy_loss_gspo", policy_cases("gspo", [{}, {"clip_range": 0.05}, {"clip_range_low": 0.1, "clip_range_high": 0.2}]))
    write(
        "policy_loss_cispo",
        policy_cases("cispo", [{}, {"enable_mask_clip": True, "mask_clip_range_low": 0.2, "mask_clip_range_high": 0.2}]),
    )
    write("policy_loss_sapo", policy_cases("sapo", [{}, {"tau_pos": 0.5, "tau_neg": 2.0}]))
    write("policy_loss_topr", policy_cases("topr", [{}, {"advantage_threshold": 0.3}]))
    write("policy_loss_sppo", policy_cases("sppo", [{}, {"epsilon": 0.1}]))
    write("policy_loss_opmd", policy_cases("opmd", [{}, {"tau": 0.3}]))
    write("policy_loss_importance_sampling", policy_cases("importance_sampling", [{}]))
    write("policy_loss_sft", policy_cases("sft", [{}], extra=()))
    write("policy_loss_sft_is", policy_cases("sft_is", [{}], extra=()))
    write("policy_loss_sft_phi", policy_cases("sft_phi", [{}, {"cutoff_prob": 0.4}], extra=()))
    rec_variants = [
        {},
        {"clip_mode": "two-side"},
        {"clip_mode": "one-side", "weight": "importance_sampling"},
        {"clip_mode": "ring", "epsilon_low_prime": 0.3, "epsilon_high_prime": 0.5},
        {"clip_mode": "gspo-one-side", "weight": "gspo_importance_sampling", "epsilon_low": 0.05, "epsilon_high": 0.05},
        {"weight": "advantage", "temp": 2.0, "regularizer": "k2", "regularizer_coef": 0.1},
        {"clip_mode": "one-side", "regularizer": "forward-kl", "regularizer_coef": 0.05},
    ]
    cases = []
    for vi, args in enumerate(rec_variants):
        b = make_batch(extra=("advantages",), empty_row=vi % 2 == 1)
        cases.append(case(f"rec-{vi}", policy_loss_fn="rec", policy_loss_fn_args=args, batch=b))
    write("policy_loss_rec", cases)

    cases = []
    for vi, args in enumerate([{}, {"beta": 0.5, "label_smoothing": 0.1}]):
        b = make_batch(rows=2)
        cases.append(case(f"dpo-one-pair-{vi}", policy_loss_fn="dpo", policy_loss_fn_args=args, batch=b))
        b = make_batch(rows=6)
        cases.append(case(f"dpo-three-pairs-{vi}", policy_loss_fn="dpo", policy_loss_fn_args=args, batch=b))
    write("policy_loss_dpo", cases)

    mix_variants = [
        {},
        {"mu": 0.3, "clip_range_low": 0.1, "clip_range_high": 0.3, "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2,
         "train_batch_size_usual": 6, "train_batch_size_expert": 3},
        {"use_dynamic_bsz": True, "ppo_mini_batch_size": 8, "ngpus_trainer": 2, "train_batch_size_usual": 6,
         "train_batch_size_expert": 4, "sft_loss_agg_mode": "seq-mean-token-sum"},
    ]
    write("policy_loss_mix", policy_cases("mix", mix_variants, extra=("advantages", "expert")))
    chord_variants = [
        {},
        {"mu_warmup_steps": 10, "mu_decay_steps": 20, "mu_peak": 0.5, "mu_valley": 0.02},
        {"mu_warmup_steps": 2, "mu_decay_steps": 20, "mu_peak": 0.5, "mu_valley": 0.02, "enable_phi_function": False,
         "ppo_mini_batch_size": 4, "train_batch_size_usual": 4, "train_batch_size_expert": 2},
    ]
    write("policy_loss_mix_chord", policy_cases("mix_chord", chord_variants, extra=("advantages", "expert", "step")))

    # KL as loss term and entropy terms, every aggregation mode.
    cases = []
    for kl in KL:
        for agg in AGG:
            b = make_batch(extra=("advantages",), empty_row=agg == "seq-mean-token-mean")
            cases.append(
                case(f"kl-{kl}-{agg}", kl_loss_fn=kl, kl_loss_fn_args={"kl_coef": 0.3}, loss_agg_mode=agg, batch=b)
            )
        b = make_batch()
        del b["old_logprob"]
        cases.append(case(f"kl-{kl}-no-old", kl_loss_fn=kl, batch=b))
    write("kl", cases)

    cases = []
    for ent in ENTROPY:
        for agg in AGG:
            b = make_batch(extra=("entropy", "expert"))
            cases.append(
                case(f"entropy-{ent}-{agg}", entropy_loss_fn=ent, entropy_loss_fn_args={"entropy_coef": 0.01}, loss_agg_mode=agg, batch=b)
            )
    write("entropy", cases)

    # End to end: advantage + policy loss + KL + entropy.
    cases = []
    for agg in AGG:
        b = make_batch(rows=6, groups=groups3, extra=("entropy",))
        cases.append(
            case(
                f"grpo-ppo-k2-{agg}",
                advantage_fn="grpo",
                policy_loss_fn="ppo",
                kl_loss_fn="k2",
                kl_loss_fn_args={"kl_coef": 0.05},
                entropy_loss_fn="default",
                entropy_loss_fn_args={"entropy_coef": 0.01},
                loss_agg_mode=agg,
                batch=b,
            )
        )
        b = make_batch(rows=6, groups=groups3, extra=("values", "entropy"))
        cases.append(
            case(
                f"gae-ppo-lowvar-{agg}",
                advantage_fn="ppo",
                advantage_fn_args={"gamma": 0.95, "lam": 0.9},
                policy_loss_fn="ppo",
                policy_loss_fn_args={"clip_range_low": 0.15, "clip_range_high": 0.25},
                kl_loss_fn="low_var_kl",
                kl_penalty_fn="k1",
                kl_penalty_fn_args={"kl_coef": 0.02},
                entropy_loss_fn="default",
                entropy_loss_fn_args={"entropy_coef": 0.02},
                loss_agg_mode=agg,
                batch=b,
            )
        )
        b = make_batch(rows=6, groups=groups3)
        cases.append(
            case(f"grpo-threshold-gspo-{agg}", advantage_fn="grpo", advantage_fn_args={"std_threshold": 0.5},
                 policy_loss_fn="gspo", kl_loss_fn="corrected_k3", loss_agg_mode=agg, batch=b)
        )
    b = make_batch(rows=6, groups=groups3, extra=("teacher",))
    cases.append(case("jsd-importance-sampling", advantage_fn="jsd", policy_loss_fn="importance_sampling", batch=b))
    b = make_batch(rows=6, groups=groups3, extra=("advantages", "entropy", "expert"))
    cases.append(
        case("mix-with-entropy", policy_loss_fn="mix", entropy_loss_fn="mix", entropy_loss_fn_args={"entropy_coef": 0.1},
             kl_loss_fn="k3", batch=b)
    )
    write("eval", cases)


if __name__ == "__main__":
    main()
