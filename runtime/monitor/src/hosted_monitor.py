# The side process of trinity's hosted monitors (wandb, mlflow, swanlab): it drives the service's official
# Python client as Trinity-RFT 0.6.0's trinity/utils/monitor.py does.
#
# Protocol (one JSON object a line): the first stdin line is the run ({"monitor", "project", "group", "name",
# "role", "args", "config", "dir"}); every later line is one step ({"step": N, "metrics": {...}}, non-finite
# values as the strings "nan", "inf", "-inf"). stdin's end finishes the run. On stdout it answers
# {"event": "imported"} once the client is imported and its arguments are usable (an {"event": "error", "stage":
# "import" or "config", "message": ...} before it is the run's error), then {"event": "ready"} once the client has
# started its run (or {"event": "error", "stage": "init", ...}: the service is down or refused the login), then
# {"event": "logged", "step": N} or {"event": "refused", "step": N, "message": ...} for every step, and
# {"event": "finished", "failed": N} at the end. Everything the clients print goes to stderr (the log file), with
# their libraries' warnings (urllib3's retries of a server that is down, say).
import json
import logging
import os
import sys
import traceback

# The protocol's pipes move to descriptors the clients' own subprocesses (wandb-core) do not inherit: a
# grandchild holding stdin open would keep trinity's writer blocked after this process ended.
protocol = os.fdopen(os.dup(1), "w", buffering=1)
steps = os.fdopen(os.dup(0), "r")
os.dup2(2, 1)
sys.stdout = sys.stderr
devnull = os.open(os.devnull, os.O_RDONLY)
os.dup2(devnull, 0)
sys.stdin = open(os.devnull)
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


imported = False


class ConfigError(Exception):
    """Monitor arguments the client cannot use: the user fixes them before anything can be reported."""


def say(event, **fields):
    global imported
    imported = imported or event == "imported"
    protocol.write(json.dumps({"event": event, **fields}) + "\n")
    protocol.flush()


def flatten(value, prefix=""):
    """Trinity-RFT's Config.flatten(): nested keys joined with dots."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
        return out
    if not prefix:
        return {}
    return {prefix[:-1]: value if isinstance(value, (int, float, str, bool)) else json.dumps(value)}


def export(args, variables):
    """Sets each environment variable whose monitor_args key is given, where the client reads it."""
    for key, variable in variables.items():
        if args.get(key):
            os.environ[variable] = args[key]


def number(value):
    return float(value) if isinstance(value, str) else value


class Wandb:
    def __init__(self, run):
        import wandb

        self.wandb = wandb
        say("imported")
        export(run["args"], {"base_url": "WANDB_BASE_URL", "api_key": "WANDB_API_KEY"})
        self.run = wandb.init(
            project=run["project"],
            group=run["group"] or run["name"],
            name=f"{run['name']}_{run['role']}",
            tags=[run["role"]],
            config=run["config"],
            save_code=False,
            # Trinity-RFT writes wandb/ in the working directory; here it sits with the run's other metrics.
            dir=os.environ.get("WANDB_DIR") or run["dir"],
        )

    def log(self, step, metrics):
        self.run.log(metrics, step=step)

    def finish(self):
        self.run.finish()


class Mlflow:
    def __init__(self, run):
        import mlflow

        self.mlflow = mlflow
        say("imported")
        args = run["args"]
        export(args, {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD"})
        mlflow.set_tracking_uri(args.get("uri") or "http://localhost:5000")
        mlflow.set_experiment(run["project"])
        try:
            mlflow.enable_system_metrics_logging()
        except Exception:
            traceback.print_exc()
        mlflow.start_run(
            run_name=f"{run['name']}_{run['role']}", tags={"group": run["group"], "role": run["role"]}
        )
        mlflow.log_params(flatten(run["config"]))

    def log(self, step, metrics):
        # MLflow refuses '@' in metric names; Trinity-RFT writes it as '_at_'.
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()}, step=step)

    def finish(self):
        self.mlflow.end_run()


class Swanlab:
    def __init__(self, run):
        import swanlab

        self.swanlab = swanlab
        args = run["args"]
        mode = args.get("mode") or "cloud"
        api_key = os.environ.get("SWANLAB_API_KEY")
        if not api_key and mode == "cloud":
            # Trinity-RFT requires the key in every mode; the local and offline modes never use it.
            raise ConfigError("SWANLAB_API_KEY environment variable not set (or set monitor_args.mode: offline)")
        say("imported")
        if api_key:
            try:
                swanlab.login(api_key=api_key, save=True)
            except Exception:
                traceback.print_exc()
        tags = list(args.get("tags") or [])
        for tag in (run["role"], run["group"]):
            if tag and tag not in tags:
                tags.append(tag)
        settings = args.get("settings")
        if isinstance(settings, dict):
            settings = swanlab.Settings(**settings)
        init = {
            "project": run["project"],
            "workspace": args.get("workspace"),
            "experiment_name": args.get("experiment_name") or f"{run['name']}_{run['role']}",
            "description": args.get("description"),
            "tags": tags or None,
            # Trinity-RFT's default is swanlog/ in the working directory; here it sits with the run's metrics.
            "logdir": args.get("logdir") or os.environ.get("SWANLAB_LOG_DIR") or os.path.join(run["dir"], "swanlog"),
            "mode": mode,
            "settings": settings,
            "id": args.get("id"),
            "config": flatten(run["config"]),
            "resume": args.get("resume"),
            "reinit": args.get("reinit"),
        }
        self.run = swanlab.init(**{k: v for k, v in init.items() if v is not None})

    def log(self, step, metrics):
        self.swanlab.log(metrics, step=step)

    def finish(self):
        self.run.finish()


def main():
    run = json.loads(steps.readline())
    kind = run["monitor"]
    try:
        client = {"wandb": Wandb, "mlflow": Mlflow, "swanlab": Swanlab}[kind](run)
    except BaseException as error:
        traceback.print_exc()
        stage = "init" if imported else "config" if isinstance(error, ConfigError) else "import"
        say("error", stage=stage, message=f"{type(error).__name__}: {error}")
        return 1
    say("ready")
    failed = 0
    for line in steps:
        record = json.loads(line)
        try:
            client.log(record["step"], {k: number(v) for k, v in record["metrics"].items()})
        except Exception as error:
            traceback.print_exc()
            say("refused", step=record["step"], message=f"{type(error).__name__}: {error}")
            failed += 1
        else:
            say("logged", step=record["step"])
    client.finish()
    say("finished", failed=failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
