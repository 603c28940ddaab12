"""trinity's Python workflow worker: runs Trinity-RFT workflow classes for trinity's explorer.

Protocol: JSON lines. trinity writes to this process's stdin, the worker answers on the stdout it was started
with; the workflow's own prints go to stderr (fd 1 is pointed there), which trinity logs. Messages:
  trinity -> worker  {"type": "run", "workflow": NAME, "task": {...}, "repeat_times": N, "model": {...}}
  worker -> trinity  {"type": "call", "id": I, "method": M, "params": {...}}   (a model call)
  trinity -> worker  {"type": "reply", "id": I, "result": ...} or {"type": "reply", "id": I, "error": "..."}
  worker -> trinity  {"type": "done", "experiences": [...]} or {"type": "failed", "traceback": "..."}
With `--check NAME` it only imports the workflow and prints one JSON line saying whether that worked.
"""

import asyncio
import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
import types

PROTOCOL_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr
sys.path.insert(0, os.getcwd())

# Trinity-RFT's modules import these at module level (trinity/utils/log.py imports ray,
# trinity/common/models/mm_utils.py imports vllm.config); trinity replaces what they do, so where they are not
# installed the worker provides stand-in modules. The finder sits last on sys.meta_path: an installed package
# is always found first.
STAND_INS = ("vllm", "ray")
PROVIDED = []


class _StandIn:
    """Whatever a module-level import or annotation reads from a stand-in module."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _StandIn()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn()

    def __getitem__(self, item):
        return _StandIn


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_StandIn,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] not in STAND_INS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        PROVIDED.append(module.__name__)
        print(f"provided a stand-in module `{module.__name__}` (not installed; trinity serves the model)", file=sys.stderr)


sys.meta_path.append(_StandInFinder())


def send(message):
    PROTOCOL_OUT.write(json.dumps(message) + "\n")
    PROTOCOL_OUT.flush()


def receive():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


class _Rpc:
    def __init__(self):
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        send({"type": "call", "id": self.next_id, "method": method, "params": params})
        reply = receive()
        if reply.get("type") != "reply" or reply.get("id") != self.next_id:
            raise RuntimeError(f"trinity answered {reply!r} to model call {method}")
        if "error" in reply:
            raise RuntimeError(f"trinity's model refused {method}: {reply['error']}")
        return reply["result"]


def resolve(name):
    """The workflow class `name`: a registered name in Trinity-RFT's WORKFLOWS, else a dotted path."""
    from trinity.common.workflows import WORKFLOWS

    cls = WORKFLOWS.get(name)
    if cls is None:
        raise ImportError(f"no workflow `{name}`: not in Trinity-RFT's WORKFLOWS registry, and not a dotted path to a class")
    return cls


class TrinityModel:
    """Trinity-RFT's ModelWrapper interface, answered by trinity's rollout model over the worker's pipes."""

    def __init__(self, rpc, info):
        self._rpc = rpc
        self._info = info

    def _experiences(self, results):
        from trinity.common.experience import Experience

        return [
            Experience(
                tokens=r["tokens"],
                logprobs=r["logprobs"],
                prompt_length=r["prompt_length"],
                prompt_text=r.get("prompt_text"),
                response_text=r.get("response_text"),
                truncate_status=r.get("truncate_status"),
            )
            for r in results
        ]

    def chat(self, messages, **kwargs):
        return self._experiences(self._rpc.call("chat", messages=list(messages), kwargs=_plain(kwargs)))

    async def chat_async(self, messages, **kwargs):
        return self.chat(messages, **kwargs)

    def generate(self, prompts, **kwargs):
        return [e for p in prompts for e in self._experiences(self._rpc.call("generate", prompt=p, kwargs=_plain(kwargs)))]

    async def generate_async(self, prompts, **kwargs):
        return self.generate(prompts, **kwargs)

    @property
    def model_version(self):
        return self._rpc.call("model_version")

    @property
    async def model_version_async(self):
        return self._rpc.call("model_version")

    @property
    def model_path(self):
        return self._info.get("model_path")

    @property
    def model_name(self):
        return self._info.get("model_path")

    @property
    def api_key(self):
        return "EMPTY"

    async def get_message_token_len(self, messages):
        return self._rpc.call("message_token_len", messages=list(messages))

    async def clean_workflow_state(self):
        pass


def _plain(kwargs):
    return {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str, bool, list, type(None)))}


def build_task(spec, cls):
    from trinity.common.config import FormatConfig, GenerationConfig
    from trinity.common.workflows.workflow import Task

    format_args = FormatConfig(**{k: v for k, v in spec["format_args"].items() if k in FormatConfig.__dataclass_fields__})
    rollout_args = GenerationConfig(
        **{k: v for k, v in spec["rollout_args"].items() if k in GenerationConfig.__dataclass_fields__ and v is not None}
    )
    reward_fn = None
    if spec.get("reward_fn"):
        from trinity.common.rewards import REWARD_FUNCTIONS

        reward_fn = REWARD_FUNCTIONS.get(spec["reward_fn"])
    return Task(
        workflow=cls,
        repeat_times=spec["repeat_times"],
        format_args=format_args,
        rollout_args=rollout_args,
        workflow_args=spec["workflow_args"],
        reward_fn_args=spec["reward_fn_args"],
        is_eval=spec["is_eval"],
        reward_fn=reward_fn,
        raw_task=spec["raw_task"],
        batch_id=spec["batch_id"],
        task_id=spec["task_id"],
        index=spec["index"],
    )


def _list(value):
    if value is None:
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return list(value)


def _json_safe(mapping):
    out = {}
    for key, value in (mapping or {}).items():
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = repr(value)
        out[str(key)] = value
    return out


def export(exp, run):
    reward = exp.reward
    if hasattr(reward, "item"):
        reward = reward.item()
    return {
        "run": exp.eid.run if exp.eid.run else run,
        "step": exp.eid.step,
        "tokens": _list(exp.tokens),
        "prompt_length": int(exp.prompt_length),
        "logprobs": _list(exp.logprobs),
        "action_mask": [bool(m) for m in _list(exp.action_mask)] if exp.action_mask is not None else None,
        "reward": None if reward is None else float(reward),
        "token_level_reward": _list(exp.token_level_reward),
        "truncate_status": exp.truncate_status,
        "info": _json_safe(exp.info),
        "metrics": {k: float(v) for k, v in _json_safe(exp.metrics).items() if isinstance(v, (int, float))},
        "prompt_text": exp.prompt_text,
        "response_text": exp.response_text,
    }


async def _run_one(workflow):
    if type(workflow).is_async:
        return await workflow.run_async()
    return workflow.run()


def run(message, rpc):
    cls = resolve(message["workflow"])
    task = build_task(message["task"], cls)
    model = TrinityModel(rpc, message["model"])
    repeat_times = message["task"]["repeat_times"]
    out = []
    if cls.can_repeat:
        workflow = task.to_workflow(model)
        workflow.set_repeat_times(repeat_times, 0)
        for exp in asyncio.run(_run_one(workflow)):
            out.append(export(exp, exp.eid.run))
    else:
        for run_index in range(repeat_times):
            workflow = task.to_workflow(model)
            for exp in asyncio.run(_run_one(workflow)):
                exp.eid.run = run_index
                out.append(export(exp, run_index))
    return out


def check(name):
    try:
        import trinity  # noqa: F401
    except ImportError as error:
        return {"ok": False, "import": error.name or "trinity", "error": str(error)}
    try:
        resolve(name)
    except Exception as error:
        missing = getattr(error, "name", None) or _missing_module(error)
        return {"ok": False, "import": missing, "error": traceback.format_exc().rstrip()}
    return {"ok": True, "provided": PROVIDED}


def _missing_module(error):
    cause = error.__cause__ or error.__context__
    while cause is not None:
        if isinstance(cause, ImportError) and cause.name:
            return cause.name
        cause = cause.__cause__ or cause.__context__
    return None


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        send(check(sys.argv[2]))
        return
    rpc = _Rpc()
    while True:
        message = receive()
        try:
            send({"type": "done", "experiences": run(message, rpc)})
        except Exception:
            send({"type": "failed", "traceback": traceback.format_exc().rstrip()})


main()
