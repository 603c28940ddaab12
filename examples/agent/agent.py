"""An agent that plays a multi-turn game against trinity in serve mode and trains the model it plays with.

The game ("running total"): "What is 17 + 20? Answer with just the number.", then on each of two more turns the
environment says "Correct." or "Wrong, it is 37." and "Now add 6 to it." The model must carry the total from turn
to turn: "it" is its own earlier answer, or the environment's correction, both in the conversation it is sent. A
move's reward, which the environment computes, is 1 when the last number in the reply is the right total, else 0.

Each step plays `--games` games, each `--plays` times (GRPO's group), all at once over the OpenAI API with the
official `openai` package; rewards every reply through `POST /feedback` (task id = game and turn, so the group of
one move is the same move of every play of that game, whose right answer is the same); commits (`POST /commit`);
then waits until the trainer has trained on the commit and the server generates with the new weights (the model
version in `GET /health`), so every step is played on the weights of the step before (on-policy).

Two ways to run it (see README.md beside this file):

    # trinity started by hand: a serve process and a train process on the same config
    python examples/agent/agent.py --base-url http://127.0.0.1:8010/v1 --steps 20

    # or the agent starts both as child processes and stops them at the end
    python examples/agent/agent.py --trinity target/release/trinity --steps 20

It prints one line per step: the mean reward, the model version the step was played with and the version the
trainer made of it. Any failure (an API error, a commit that does not take every reward, weights that never come,
a trinity process that fails) ends it with a message and a non-zero exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import openai

HERE = Path(__file__).resolve().parent
TURNS = 3
ANSWER = "Answer with just the number."


@dataclass
class RunningTotal:
    """One game: two numbers to add, then a number to add to the result on each later turn."""

    start: int
    additions: list[int]

    @staticmethod
    def deal(rng: random.Random) -> "RunningTotal":
        later = [rng.randint(2, 9) for _ in range(TURNS - 1)]
        return RunningTotal(rng.randint(10, 49), [rng.randint(10, 49), *later])

    def total_after(self, turn: int) -> int:
        return self.start + sum(self.additions[: turn + 1])

    def opening(self) -> str:
        return f"What is {self.start} + {self.additions[0]}? {ANSWER}"

    def judge(self, turn: int, reply: str) -> tuple[float, str | None]:
        """The reward of the reply to `turn` and the environment's next message (None when the game is over)."""
        numbers = re.findall(r"-?\d+", reply.replace(",", ""))
        right = self.total_after(turn)
        correct = bool(numbers) and int(numbers[-1]) == right
        if turn + 1 == len(self.additions):
            return float(correct), None
        verdict = "Correct." if correct else f"Wrong, it is {right}."
        return float(correct), f"{verdict} Now add {self.additions[turn + 1]} to it. {ANSWER}"


@dataclass
class Move:
    response_id: str
    reward: float


@dataclass
class Play:
    game: int
    play: int
    moves: list[Move] = field(default_factory=list)


def play_game(client: openai.OpenAI, model: str, game: RunningTotal, index: int, play: int, max_tokens: int) -> Play:
    """Plays one game to the end: every turn's messages hold the earlier replies and the environment's answers."""
    messages = [{"role": "user", "content": game.opening()}]
    result = Play(index, play)
    for turn in range(len(game.additions)):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
        text = reply.choices[0].message.content or ""
        reward, next_message = game.judge(turn, text)
        result.moves.append(Move(reply.id, reward))
        if next_message is None:
            break
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": next_message}]
    return result


class Server:
    """trinity's own endpoints beside the OpenAI API: /health, /feedback, /commit."""

    def __init__(self, base_url: str):
        self.root = base_url.rstrip("/").removesuffix("/v1")

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.root + path, data=data, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise SystemExit(f"agent: {path} answered {error.code}: {error.read().decode(errors='replace')}")

    def model_version(self) -> int:
        return int(self._call("/health")["model_version"])

    def feedback(self, response_id: str, reward: float, task_id: str, run_id: int) -> None:
        self._call("/feedback", {"msg_ids": [response_id], "reward": reward, "task_id": task_id, "run_id": run_id})

    def commit(self) -> dict:
        return self._call("/commit", {})


def wait_for_new_weights(server: Server, seen: int, timeout: float, children: "Children | None") -> int:
    """Waits until the server generates with weights newer than version `seen`; returns the new version."""
    deadline = time.monotonic() + timeout
    while True:
        version = server.model_version()
        if version > seen:
            return version
        if children is not None:
            children.check()
            # A trainer that finished its steps publishes its last weights before it exits; the server loads
            # them within 2 s, so one that exited long before they show has no more to give.
            deadline = min(deadline, children.trainer_exit_time() + 15)
        if time.monotonic() > deadline:
            if children is not None and children.trainer_exited is not None:
                raise SystemExit(
                    f"agent: trinity (train) exited and the server still generates with model version {seen}:\n"
                    f"{children.log_tail('train')}"
                )
            raise SystemExit(
                f"agent: the server still generates with model version {seen} after {timeout:.0f} s: is a trainer "
                "(`mode: train` on the same config) running, with buffer.train_batch_size equal to "
                "games × plays × 3 and synchronizer.sync_interval 1? (--no-wait-for-weights plays on regardless)"
            )
        time.sleep(0.5)


class Children:
    """trinity in mode serve and in mode train, started by the agent (`--trinity`) on one run directory."""

    def __init__(self, args: argparse.Namespace, batch: int):
        self.run_dir = Path(args.run_dir or f"checkpoints/agent-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        common = [args.trinity, "run", "--config", str(args.config), "--set", f"checkpoint_root_dir={self.run_dir}"]
        for setting in args.set:
            common += ["--set", setting]
        serve = common + ["--set", "mode=serve", "--set", "explorer.proxy_port=0"]
        train = common + ["--set", "mode=train", "--set", f"buffer.total_steps={args.steps}"]
        train += ["--set", f"buffer.train_batch_size={batch}"]
        self.processes: dict[str, subprocess.Popen] = {}
        self.trainer_exited: float | None = None
        for role, command in (("serve", serve), ("train", train)):
            with open(self.run_dir / f"{role}.log", "wb") as log:
                self.processes[role] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def log_tail(self, role: str, lines: int = 30) -> str:
        text = (self.run_dir / f"{role}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def trainer_exit_time(self) -> float:
        """When the trainer was first seen exited (infinity while it runs)."""
        if self.trainer_exited is None and self.processes["train"].poll() is not None:
            self.trainer_exited = time.monotonic()
        return self.trainer_exited if self.trainer_exited is not None else float("inf")

    def check(self) -> None:
        """Fails when a child has exited before its time."""
        for role, process in self.processes.items():
            code = process.poll()
            if code is not None and (code != 0 or role == "serve"):
                raise SystemExit(f"agent: trinity ({role}) exited with {code}:\n{self.log_tail(role)}")

    def base_url(self, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted(self.run_dir.rglob("*_server_url.txt"))
            if found:
                return found[0].read_text().strip() + "/v1"
            self.check()
            time.sleep(0.2)
        raise SystemExit(f"agent: trinity (serve) wrote no server URL in {timeout:.0f} s:\n{self.log_tail('serve')}")

    def stop(self, trainer_timeout: float) -> list[str]:
        """Stops the server (SIGTERM: it finishes requests and marks its producer finished) and waits for the
        trainer to save its last checkpoint and exit; returns what went wrong."""
        failures = []
        serve, train = self.processes["serve"], self.processes["train"]
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            train.wait(timeout=trainer_timeout)
        if train.poll() is None:
            train.send_signal(signal.SIGTERM)
            failures.append("trinity (train) had not finished its steps and was stopped")
        for role, process in (("train", train), ("serve", serve)):
            try:
                code = process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
                failures.append(f"trinity ({role}) did not stop within 120 s of SIGTERM and was killed")
            if code != 0:
                failures.append(f"trinity ({role}) exited with {code}:\n{self.log_tail(role)}")
        return failures


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="the server's OpenAI base URL, e.g. http://127.0.0.1:8010/v1")
    parser.add_argument("--trinity", help="start this trinity binary in mode serve and in mode train instead")
    parser.add_argument("--config", default=HERE / "agent.yaml", type=Path, help="the config of --trinity's runs")
    parser.add_argument("--run-dir", help="checkpoint_root_dir of --trinity's runs (default: checkpoints/agent-<time>)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed on to --trinity")
    parser.add_argument("--steps", type=int, default=20, help="steps (one commit and one train step each)")
    parser.add_argument("--games", type=int, default=2, help="different games a step")
    parser.add_argument("--plays", type=int, default=4, help="plays of each game a step (the GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=16, help="most tokens of one reply")
    parser.add_argument("--seed", type=int, default=0, help="seed of the games dealt")
    parser.add_argument(
        "--wait-for-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after each commit, wait for the weights trained on it (on-policy)",
    )
    parser.add_argument("--weights-timeout", type=float, default=900, help="seconds to wait for new weights")
    args = parser.parse_args()
    if (args.base_url is None) == (args.trinity is None):
        parser.error("give one of --base-url (a running server) and --trinity (start one)")
    if min(args.steps, args.games, args.plays) < 1:
        parser.error("--steps, --games and --plays must be at least 1")
    return args


def run_steps(args: argparse.Namespace, base_url: str, children: Children | None) -> list[float]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=600, max_retries=0)
    server = Server(base_url)
    [model] = [m.id for m in client.models.list().data]
    expected = args.games * args.plays * TURNS
    rewards = []
    for step in range(1, args.steps + 1):
        version = server.model_version()
        rng = random.Random(args.seed * 1_000_003 + step)
        games = [RunningTotal.deal(rng) for _ in range(args.games)]
        started = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=args.games * args.plays)
        try:
            plays = list(
                pool.map(
                    lambda gp: play_game(client, model, games[gp[0]], gp[0], gp[1], args.max_tokens),
                    [(g, p) for g in range(args.games) for p in range(args.plays)],
                )
            )
        except openai.APIError as error:
            raise SystemExit(f"agent: step {step}: a chat completion failed: {error}")
        finally:
            # On Ctrl-C or an error, games in flight are not waited for: stopping trinity ends their requests.
            pool.shutdown(wait=False, cancel_futures=True)
        played = time.monotonic() - started
        moves = [(play, turn, move) for play in plays for turn, move in enumerate(play.moves)]
        for play, turn, move in moves:
            server.feedback(move.response_id, move.reward, f"step{step}-game{play.game}-turn{turn}", play.play)
        report = server.commit()
        if report["committed"] != len(moves) or len(moves) != expected:
            raise SystemExit(f"agent: step {step} rewarded {len(moves)} replies of {expected}; /commit: {report}")
        started = time.monotonic()
        trained = version
        if args.wait_for_weights:
            trained = wait_for_new_weights(server, version, args.weights_timeout, children)
        mean = sum(move.reward for _, _, move in moves) / len(moves)
        perfect = sum(all(m.reward == 1.0 for m in play.moves) for play in plays)
        rewards.append(mean)
        print(
            f"step {step}/{args.steps} mean_reward={mean:.3f} model_version={version} trained_version={trained} "
            f"committed={report['committed']} perfect_games={perfect}/{len(plays)} "
            f"play_s={played:.1f} train_wait_s={time.monotonic() - started:.1f}",
            flush=True,
        )
    return rewards


def main() -> int:
    args = parse_args()
    children = Children(args, args.games * args.plays * TURNS) if args.trinity else None
    failures = []
    finished = False
    try:
        base_url = children.base_url() if children else args.base_url
        if children:
            print(f"agent: trinity serves {base_url} (logs and run in {children.run_dir})", flush=True)
        rewards = run_steps(args, base_url, children)
        head, tail = rewards[: min(5, len(rewards))], rewards[-min(5, len(rewards)) :]
        print(
            f"agent: mean reward of the first {len(head)} steps {sum(head) / len(head):.3f}, "
            f"of the last {len(tail)} {sum(tail) / len(tail):.3f}",
            flush=True,
        )
        finished = True
    finally:
        if children:
            # After the last step the trainer saves its final checkpoint and exits by itself; after a failure
            # it would wait for experiences that never come, so it is stopped at once.
            failures = children.stop(trainer_timeout=600 if finished else 0)
    for failure in failures:
        print(f"agent: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
