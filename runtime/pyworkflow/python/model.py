"""The model side of trinity's Python workflow worker: Trinity-RFT 0.6.0's ModelWrapper as a workflow sees it,
answered over the worker's pipes (`_Rpc` in worker.py, which trinity runs after this file as one script).
"""

import asyncio
import copy
import json
import threading


def _tensor(values, dtype):
    import torch

    return torch.tensor(values if values is not None else [], dtype=dtype)


def _experience(result, messages=None):
    """Trinity-RFT's Experience from one trinity result."""
    import torch
    from trinity.common.experience import Experience

    mask = result.get("action_mask")
    return Experience(
        tokens=_tensor(result["tokens"], torch.int32),
        logprobs=_tensor(result.get("logprobs"), torch.float32),
        prompt_length=result["prompt_length"],
        action_mask=None if mask is None else _tensor(mask, torch.bool),
        prompt_text=result.get("prompt_text"),
        response_text=result.get("response_text"),
        truncate_status=result.get("truncate_status"),
        messages=messages,
    )


def _samples(generation):
    """The experiences of one generation reply: trinity sends the prompt once and each sample's own tokens."""
    prompt = generation["prompt"]
    return [
        _experience(
            {
                "tokens": prompt + sample["response"],
                "prompt_length": len(prompt),
                "logprobs": sample["logprobs"],
                "prompt_text": generation["prompt_text"],
                "response_text": sample["response_text"],
                "truncate_status": sample["truncate_status"],
            }
        )
        for sample in generation["samples"]
    ]


def _plain(kwargs):
    """The keyword arguments that cross the pipe: JSON values (sampling settings, stop lists, tool schemas)."""
    out = {}
    for key, value in kwargs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


def _model_config(settings):
    from trinity.common.config import InferenceModelConfig

    known = InferenceModelConfig.__dataclass_fields__
    return InferenceModelConfig(**{k: v for k, v in settings.items() if k in known and v is not None})


class _UnservedClient:
    """An auxiliary model's OpenAI client where trinity serves none (see TrinityModel._unserved)."""

    def __init__(self, model_path):
        self.model_path = model_path

    def __getattr__(self, name):
        raise ValueError(
            f"the OpenAI client of auxiliary model `{self.model_path}` needs the rollout model's OpenAI-compatible "
            "API, which serves the auxiliary models too: set `explorer.rollout_model.enable_openai_api: true`"
        )


class _SessionCounter:
    next = 1


class TrinityModel:
    """Trinity-RFT 0.6.0's ModelWrapper, answered by trinity's rollout model (or, for a wrapper of an auxiliary
    model, that model: `index`) over the worker's pipes."""

    def __init__(self, rpc, settings, index=None):
        self._rpc = rpc
        self._index = index
        self.config = _model_config(settings)
        self._settings = settings
        self._api_key = self.config.api_key
        self._generate_kwargs = {
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
            "max_tokens": self.config.max_response_tokens,
        }
        if self.config.enable_thinking is not None:
            self._generate_kwargs["extra_body"] = {
                "chat_template_kwargs": {"enable_thinking": self.config.enable_thinking}
            }
        self.enable_lora = False
        self.enable_history = bool(self.config.enable_history)
        self.history = []
        self.workflow_state = {}
        self._state_lock = threading.Lock()
        # The OpenAI session (trinity's per-wrapper base URL) whose recorded replies are this wrapper's.
        self._session = 0
        self.openai_client = None
        self.openai_async_client = None
        # Whether the rollout model's OpenAI API, which also serves the auxiliary models, is on.
        self.rollout_openai_api = bool(self.config.enable_openai_api)

    def _call(self, method, **params):
        return self._rpc.call(method, model=self._index, **params)

    async def _call_async(self, method, **params):
        return await self._rpc.call_async(method, model=self._index, **params)

    def _record(self, experiences):
        if self.enable_history:
            self._take_recorded()
            self.history.extend(experiences)
        return experiences

    def _take_recorded(self):
        """Moves the replies trinity's OpenAI server recorded for this wrapper into its history, so that the
        history keeps the order in which the calls completed."""
        opened = self.openai_client is not None or self.openai_async_client is not None
        if self.enable_history and self._index is None and opened:
            self.history.extend(_experience(r) for r in self._rpc.call("history", session=self._session))

    # Generation.
    def chat(self, messages, **kwargs):
        generation = self._call("chat", messages=list(messages), kwargs=_plain(kwargs))
        return self._record(_samples(generation))

    async def chat_async(self, messages, **kwargs):
        generation = await self._call_async("chat", messages=list(messages), kwargs=_plain(kwargs))
        return self._record(_samples(generation))

    def generate(self, prompts, **kwargs):
        futures = [self._rpc.start("generate", {"model": self._index, "prompt": p, "kwargs": _plain(kwargs)}) for p in prompts]
        return self._record([e for f in futures for e in _samples(f.result())])

    async def generate_async(self, prompts, **kwargs):
        calls = [self._call_async("generate", prompt=p, kwargs=_plain(kwargs)) for p in prompts]
        generations = await asyncio.gather(*calls)
        return self._record([e for g in generations for e in _samples(g)])

    def _temperature(self, temperature):
        if temperature is not None:
            return temperature
        return self.config.temperature if self.config.temperature is not None else 1.0

    def logprobs(self, tokens, temperature=None):
        import torch

        values = self._call("logprobs", tokens=_list(tokens), temperature=self._temperature(temperature))
        return torch.tensor(values, dtype=torch.float32)

    async def logprobs_async(self, tokens, temperature=None):
        import torch

        values = await self._call_async("logprobs", tokens=_list(tokens), temperature=self._temperature(temperature))
        return torch.tensor(values, dtype=torch.float32)

    def convert_messages_to_experience(self, messages, tools=None, temperature=None):
        result = self._call("convert_messages", messages=list(messages), tools=tools, temperature=self._temperature(temperature))
        return _experience(result, messages=messages)

    async def convert_messages_to_experience_async(self, messages, tools=None, temperature=None):
        result = await self._call_async(
            "convert_messages", messages=list(messages), tools=tools, temperature=self._temperature(temperature)
        )
        return _experience(result, messages=messages)

    # What the wrapper says about its model.
    @property
    def model_version(self):
        return self._call("model_version")

    @property
    async def model_version_async(self):
        return await self._call_async("model_version")

    @property
    def model_path(self):
        return self.config.model_path

    @property
    def model_name(self):
        return self.config.model_path

    @property
    def model_config(self):
        return self.config

    @property
    def generate_kwargs(self):
        return self._generate_kwargs

    @property
    def api_key(self):
        return self._api_key

    def get_lora_request(self):
        return None

    async def get_lora_request_async(self):
        return None

    async def prepare(self):
        pass

    async def get_message_token_len(self, messages):
        return await self._call_async("message_token_len", messages=list(messages))

    # The OpenAI clients.
    def _endpoint(self):
        if self._index is None and not self.config.enable_openai_api:
            raise ValueError(
                "OpenAI API is not enabled for this model: set `explorer.rollout_model.enable_openai_api: true` "
                "to get an OpenAI client of the rollout model"
            )
        return self._rpc.call("openai", model=self._index, session=self._session)

    def _unserved(self):
        """Trinity-RFT's workflows take every auxiliary model's OpenAI client when they are built; trinity serves
        those clients from the rollout model's OpenAI API, so without it a workflow still builds and may use the
        wrappers, and only a use of the client fails, naming the key."""
        if self._index is not None and not self.rollout_openai_api:
            return _UnservedClient(self.config.name or self.config.model_path)
        return None

    def get_openai_client(self):
        import openai

        if self.openai_client is None and self._unserved() is not None:
            return self._unserved()
        if self.openai_client is None:
            endpoint = self._endpoint()
            client = openai.OpenAI(base_url=endpoint["base_url"], api_key=self._api_key)
            client.model_path = endpoint["model_name"]
            if self.enable_history:
                create = client.chat.completions.create

                def recorded_create(*args, **kwargs):
                    kwargs.setdefault("logprobs", True)
                    response = create(*args, **kwargs)
                    if not kwargs.get("stream", False):
                        self._take_recorded()
                    return response

                client.chat.completions.create = recorded_create
            self.openai_client = client
        return self.openai_client

    def get_openai_async_client(self):
        import openai

        if self.openai_async_client is None and self._unserved() is not None:
            return self._unserved()
        if self.openai_async_client is None:
            endpoint = self._endpoint()
            client = openai.AsyncOpenAI(base_url=endpoint["base_url"], api_key=self._api_key)
            client.model_path = endpoint["model_name"]
            if self.enable_history:
                create = client.chat.completions.create

                async def recorded_create(*args, **kwargs):
                    kwargs.setdefault("logprobs", True)
                    response = await create(*args, **kwargs)
                    if not kwargs.get("stream", False):
                        recorded = await self._rpc.call_async("history", session=self._session)
                        self.history.extend(_experience(r) for r in recorded)
                    return response

                client.chat.completions.create = recorded_create
            self.openai_async_client = client
        return self.openai_async_client

    def extract_experience_from_history(self, clear_history=True):
        if not self.enable_history:
            raise ValueError("History recording is not enabled: set `explorer.rollout_model.enable_history: true`")
        self._take_recorded()
        experiences = list(self.history)
        if clear_history:
            self.history.clear()
        return experiences

    # Workflow state.
    async def set_workflow_state(self, state):
        with self._state_lock:
            self.workflow_state.update(state)

    async def get_workflow_state(self):
        with self._state_lock:
            return dict(self.workflow_state)

    async def clean_workflow_state(self):
        with self._state_lock:
            self.workflow_state = {}
            self._take_recorded()
            self.history.clear()

    def clone_with_isolated_history(self):
        clone = copy.copy(self)
        clone.openai_client = None
        clone.openai_async_client = None
        clone.history = []
        clone._session = _SessionCounter.next
        _SessionCounter.next += 1
        return clone


