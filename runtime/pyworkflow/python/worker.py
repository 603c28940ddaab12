"""trinity's Python workflow worker: runs Trinity-RFT workflow classes for trinity's explorer.

Protocol: JSON lines. trinity writes to this process's stdin, the worker answers on the stdout it was started
with; the workflow's own prints go to stderr (fd 1 is pointed there), which trinity logs. Messages:
  trinity -> worker  {"type": "run", "workflow": NAME, "task": {...}, "model": {...}, "auxiliary_models": [...],
                     "concurrent_mode": MODE, "collect_partial_runs": BOOL}
                     (model settings: InferenceModelConfig fields)
  worker -> trinity  {"type": "call", "id": I, "method": M, "params": {...}}   (a model call)
  trinity -> worker  {"type": "reply", "id": I, "result": ...} or {"type": "reply", "id": I, "error": "..."}
  worker -> trinity  {"type": "done", "experiences": [...], "failed_runs": [{"run": R, "traceback": "..."}],
                     "completed_runs": C, "total_runs": N} or {"type": "failed", "traceback": "..."}
A reply with `"budget": true` refuses a call past the task's model budget (ModelBudgetExceeded). A workflow
that cannot repeat runs once per repeat; the runs that raised are listed in `failed_runs`, the others' experiences
are kept, as Trinity-RFT's runner keeps them.
Calls carry ids: any number may be in flight (from coroutines or threads) and trinity answers them in any order.
The worker keeps its model wrappers and its last workflow instance across tasks, as Trinity-RFT's runner does.
trinity runs model.py (the ModelWrapper stand-in) and this file as one script. With `--check NAME` (this file
alone) it only imports the workflow and prints one JSON line saying whether that worked.
"""

import asyncio
import concurrent.futures
import importlib.abc
import importlib.machinery
import json
import os
import queue
import sys
import threading
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

    def __class_getitem__(cls, item):
        # A stand-in class used as a generic in an annotation (`ActorHandle[InferenceModel]` in Trinity-RFT's
        # model.py, evaluated at class definition) stays that class.
        return cls


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


class ModelBudgetExceeded(RuntimeError):
    """A model call past the task's budget (`explorer.python_workflows.max_model_calls` / `max_model_tokens`):
    raised by the call that would break it and by every call after it. The task fails whatever the workflow does
    with it, as a WASM workflow's task fails when it goes past its budget."""


class _Rpc:
    """The worker's side of the pipes. A reader thread takes trinity's messages: replies complete the call of
    their id, so any number of calls can be in flight at once (from a coroutine or from a thread), and trinity
    answers them concurrently; tasks are queued for the main loop."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending = {}
        self._closed = False
        self.tasks = queue.Queue()

    def send(self, message):
        line = json.dumps(message) + "\n"
        with self._lock:
            PROTOCOL_OUT.write(line)
            PROTOCOL_OUT.flush()

    def start_reader(self):
        threading.Thread(target=self._read, name="trinity-rpc", daemon=True).start()

    def _read(self):
        for line in sys.stdin:
            message = json.loads(line)
            if message.get("type") == "reply":
                with self._lock:
                    future = self._pending.pop(message.get("id"), None)
                if future is None:
                    print(f"trinity answered a call that is not waiting: {message!r}", file=sys.stderr)
                elif "error" in message:
                    refused = ModelBudgetExceeded if message.get("budget") else RuntimeError
                    future.set_exception(refused(f"trinity's model refused the call: {message['error']}"))
                else:
                    future.set_result(message.get("result"))
            else:
                self.tasks.put(message)
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(EOFError("trinity closed the worker's input"))
        self.tasks.put(None)

    def abandon_pending(self):
        """Fails the calls still waiting when a task ends (trinity stops answering them), so that a run still
        blocked on one in a thread of the task ends instead of holding the worker."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            # A call the run already cancelled (asyncio cancels a gathered sibling when one raises) is done.
            try:
                future.set_exception(RuntimeError("the task ended before trinity answered this model call"))
            except concurrent.futures.InvalidStateError:
                pass

    def start(self, method, params):
        """Sends a call; its reply completes the returned concurrent future."""
        future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EOFError("trinity closed the worker's input")
            self._next_id += 1
            call_id = self._next_id
            self._pending[call_id] = future
        self.send({"type": "call", "id": call_id, "method": method, "params": params})
        return future

    def call(self, method, **params):
        return self.start(method, params).result()

    async def call_async(self, method, **params):
        return await asyncio.wrap_future(self.start(method, params))


PLUGINS_LOADED = []


def load_plugin_dirs():
    """Loads the user's plugin modules once, as Trinity-RFT's explorer does (trinity/utils/plugin_loader.py):
    each `*.py` not starting with `__` in the TRINITY_PLUGIN_DIRS directories (os.pathsep-separated; Trinity-RFT's
    own `trinity/plugins` when unset) runs as module `trinity.plugins.<stem>`, so what it registers in WORKFLOWS
    resolves. A file that fails to load is reported and skipped, as Trinity-RFT does. Unlike Trinity-RFT, the
    files are not copied into the installed `trinity/plugins`: the host leaves the user's install untouched."""
    if PLUGINS_LOADED:
        return
    PLUGINS_LOADED.append(True)
    import importlib.util
    from pathlib import Path

    import trinity.plugins

    dirs = [d for d in os.environ.get("TRINITY_PLUGIN_DIRS", "").split(os.pathsep) if d]
    if not dirs:
        dirs = list(trinity.plugins.__path__)
    for plugin_dir in sorted(set(dirs)):
        if not os.path.isdir(plugin_dir):
            print(f"TRINITY_PLUGIN_DIRS: `{plugin_dir}` is not a directory; skipped", file=sys.stderr)
            continue
        for file in sorted(Path(plugin_dir).glob("*.py")):
            if file.name.startswith("__"):
                continue
            module_name = f"trinity.plugins.{file.stem}"
            if module_name in sys.modules:
                continue
            try:
                spec = importlib.util.spec_from_file_location(module_name, str(file))
                module = importlib.util.module_from_spec(spec)
                module.__package__ = "trinity.plugins"
                spec.loader.exec_module(module)
                sys.modules[module_name] = module
                print(f"loaded plugin module `{module_name}` from {file}", file=sys.stderr)
            except Exception:
                print(f"plugin module {file} failed to load; skipped:\n{traceback.format_exc()}", file=sys.stderr)


def registered_names():
    """Every name Trinity-RFT's WORKFLOWS registry resolves without a dotted path: its built-in table and what
    plugins registered."""
    from trinity.common.workflows import WORKFLOWS

    load_plugin_dirs()
    return sorted(set(getattr(WORKFLOWS, "_default_mapping", {})) | set(WORKFLOWS.modules))


def resolve(name):
    """The workflow class `name`: a registered name in Trinity-RFT's WORKFLOWS, else a dotted path."""
    from trinity.common.workflows import WORKFLOWS

    load_plugin_dirs()
    if "." not in name and name not in registered_names():
        raise LookupError(f"no workflow `{name}` in Trinity-RFT's WORKFLOWS registry (nor registered by TRINITY_PLUGIN_DIRS)")
    cls = WORKFLOWS.get(name)
    if cls is None:
        raise ImportError(f"no workflow `{name}`: not in Trinity-RFT's WORKFLOWS registry, and not a dotted path to a class")
    return cls


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


class _Host:
    """What a worker keeps across its tasks, as Trinity-RFT's WorkflowRunner does: the model wrappers and the
    last workflow instance, which a `can_reset` workflow of the same class reuses with `reset(task)`."""

    def __init__(self, rpc):
        self.rpc = rpc
        self.model = None
        self.auxiliary = []
        self.instance = None

    def wrappers(self, message):
        if self.model is None:
            self.model = TrinityModel(self.rpc, message["model"])
            self.auxiliary = [TrinityModel(self.rpc, settings, index=i) for i, settings in enumerate(message["auxiliary_models"])]
            for wrapper in self.auxiliary:
                wrapper.rollout_openai_api = self.model.rollout_openai_api
        return self.model, self.auxiliary

    def instance_for(self, task):
        """The runner's workflow instance for `task`: the last one reset, if its class can be, else a new one."""
        instance = self.instance
        if instance is None or instance.__class__ is not task.workflow or not instance.__class__.can_reset:
            self.instance = task.to_workflow(self.model, self.auxiliary)
        else:
            instance.reset(task)
        return self.instance

    def isolated_instance(self, task):
        model = self.model.clone_with_isolated_history() if self.model.enable_history else self.model
        return task.to_workflow(model, self.auxiliary)

    async def run(self, message):
        try:
            return await self._run(message)
        finally:
            self.rpc.abandon_pending()

    async def _run(self, message):
        cls = resolve(message["workflow"])
        task = build_task(message["task"], cls)
        self.wrappers(message)
        repeat_times = message["task"]["repeat_times"]
        if cls.can_repeat:
            workflow = self.instance_for(task)
            workflow.set_repeat_times(repeat_times, 0)
            await self.model.clean_workflow_state()
            experiences = [export(exp, exp.eid.run) for exp in await _run_one(workflow)]
            return {"experiences": experiences, "failed_runs": [], "completed_runs": repeat_times, "total_runs": repeat_times}
        mode = message.get("concurrent_mode") or "sequential"
        # Trinity-RFT's runner keeps the runs that finished when others raise; with `return_partial_tasks` false
        # (its default) the first failure ends the task's other runs: those after it (sequential) or those still
        # running (asynchronous, multi-threading).
        keep_going = bool(message.get("collect_partial_runs"))
        if mode in ("asynchronous", "multi-threading"):
            threads = mode == "multi-threading"
            runs = [self._isolated_run(task, i, threads) for i in range(repeat_times)]
            results = await _gather_runs(runs, keep_going)
        else:
            results = []
            for run_index in range(repeat_times):
                results.append(await _attempt(run_index, self._sequential_run(task)))
                if results[-1][1][1] is not None and not keep_going:
                    break
        out, failed = [], []
        for run_index, (experiences, error) in sorted(results, key=lambda r: r[0]):
            if error is not None:
                failed.append({"run": run_index, "traceback": error})
                continue
            for exp in experiences:
                exp.eid.run = run_index
                out.append(export(exp, run_index))
        completed = sum(1 for _, (_, error) in results if error is None)
        return {"experiences": out, "failed_runs": failed, "completed_runs": completed, "total_runs": repeat_times}

    async def _sequential_run(self, task):
        await self.model.clean_workflow_state()
        return await _run_one(self.instance_for(task))

    async def _isolated_run(self, task, run_index, threads):
        async def run():
            workflow = self.isolated_instance(task)
            await self.model.clean_workflow_state()
            if threads:
                return await asyncio.to_thread(lambda: asyncio.run(_run_one(workflow)))
            return await _run_one(workflow)

        return await _attempt(run_index, run())


async def _attempt(run_index, run):
    """(run index, (experiences, None)) or, where the run raised, (run index, (None, its traceback))."""
    try:
        return run_index, (await run, None)
    except Exception:
        return run_index, (None, traceback.format_exc().rstrip())


async def _gather_runs(runs, keep_going):
    """The results of concurrent runs; unless `keep_going`, the first failure cancels the runs still going, whose
    results are then missing (a thread's run is not stopped, only no longer waited for), as in Trinity-RFT's
    runner."""
    if keep_going:
        return list(await asyncio.gather(*runs))
    pending = {asyncio.ensure_future(run) for run in runs}
    results = []
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        results.extend(future.result() for future in done)
        if any(result[1][1] is not None for result in results) and pending:
            for future in pending:
                future.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            break
    return results


async def _run_one(workflow):
    if type(workflow).is_async:
        return await workflow.run_async()
    return workflow.run()


def check(name):
    """Whether workflow `name` resolves here. `registered` says whether Trinity-RFT's registry (with the plugin
    dirs) knows a non-dotted name, `names` lists that registry; a class whose module imports packages that are
    not installed, also inside functions (Trinity-RFT's environment workflows import gymnasium, alfworld or
    agentscope only when they run), fails here, naming them (`imports`), rather than in every task."""
    try:
        import trinity  # noqa: F401
    except ImportError as error:
        return {"ok": False, "import": error.name or "trinity", "error": str(error)}
    try:
        names = registered_names()
    except Exception as error:
        missing = getattr(error, "name", None) or _missing_module(error)
        return {"ok": False, "import": missing, "error": traceback.format_exc().rstrip()}
    registered = "." in name or name in names
    if not registered:
        return {"ok": False, "registered": False, "names": names, "error": f"Trinity-RFT's WORKFLOWS registry has no `{name}`"}
    try:
        cls = resolve(name)
    except Exception as error:
        missing = getattr(error, "name", None) or _missing_module(error)
        return {"ok": False, "registered": True, "names": names, "import": missing, "error": traceback.format_exc().rstrip()}
    missing = _missing_imports(cls)
    if missing:
        where = "; ".join(f"`{module}` imports `{imported}` (line {line})" for module, imported, line in missing)
        tops = sorted({imported.split(".")[0] for _, imported, _ in missing})
        return {
            "ok": False,
            "registered": True,
            "names": names,
            "import": tops[0],
            "imports": tops,
            "error": f"{where}, which is not installed",
        }
    return {"ok": True, "registered": True, "names": names, "provided": PROVIDED}


def _missing_imports(cls):
    """(module, import, line), the first per package, for each absolute import of a top-level package that is not
    installed, anywhere in the modules that define `cls` and its bases (outside Trinity-RFT's base module),
    functions included, and in the not-yet-imported modules of the same top-level packages those import inside functions (Trinity-RFT's
    AgentScope workflow imports its agent module, which imports agentscope, only when it runs). Imports under
    `if TYPE_CHECKING` and optional ones (a `try` whose ImportError handler does not raise) are left out: the
    workflow runs without them."""
    import ast
    import importlib.util
    import inspect

    pending = []
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is None or module.__name__ in ("builtins", "trinity.common.workflows.workflow"):
            continue
        try:
            pending.append((module.__name__, inspect.getsourcefile(module)))
        except TypeError:
            continue
    # Modules beside those, already imported by them (Trinity-RFT's RAFT AlfWorld workflow imports its game
    # environment in a helper module of its package).
    folders = {os.path.dirname(path) for _, path in pending if path}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and os.path.dirname(path) in folders:
            pending.append((module.__name__, path))
    own = {name.split(".")[0] for name, _ in pending}
    seen = set()
    missing = []
    while pending:
        name, path = pending.pop(0)
        if path is None or path in seen:
            continue
        seen.add(path)
        try:
            with open(path, encoding="utf-8") as source:
                tree = ast.parse(source.read())
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node, imported in _imports(tree):
            top = imported.split(".")[0]
            if top in STAND_INS:
                continue
            if top not in sys.modules and importlib.util.find_spec(top) is None:
                if top not in [i.split(".")[0] for _, i, _ in missing]:
                    missing.append((name, imported, node.lineno))
            elif top in own and imported not in sys.modules:
                try:
                    spec = importlib.util.find_spec(imported)
                except (ImportError, ValueError):
                    spec = None
                if spec is not None and spec.origin and spec.origin.endswith(".py"):
                    pending.append((imported, spec.origin))
    return missing


def _imports(tree):
    """The required absolute imports of a module's syntax tree, as (node, module name)."""
    import ast

    found = []

    def optional_try(node):
        catches = ("ImportError", "ModuleNotFoundError", "Exception")
        for handler in node.handlers:
            names = [n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)] if handler.type else ["Exception"]
            if any(n in catches for n in names) and not any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
                return True
        return False

    def visit(node):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Try) and optional_try(node):
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _missing_module(error):
    cause = error.__cause__ or error.__context__
    while cause is not None:
        if isinstance(cause, ImportError) and cause.name:
            return cause.name
        cause = cause.__cause__ or cause.__context__
    return None


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        PROTOCOL_OUT.write(json.dumps(check(sys.argv[2])) + "\n")
        PROTOCOL_OUT.flush()
        return
    rpc = _Rpc()
    rpc.start_reader()
    host = _Host(rpc)
    # One event loop for the worker's life, as Trinity-RFT's runner has: an async client a workflow keeps between
    # tasks (the model's OpenAI async client, an agent's) holds connections bound to the loop it first ran on, and
    # a loop per task left the next task's request closing them on a closed loop.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    while True:
        message = rpc.tasks.get()
        if message is None:
            return
        try:
            rpc.send({"type": "done", **loop.run_until_complete(host.run(message))})
        except Exception:
            rpc.send({"type": "failed", "traceback": traceback.format_exc().rstrip()})


main()
