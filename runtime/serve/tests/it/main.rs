//! Integration tests of the OpenAI-compatible server over real sockets: endpoints, errors, streaming,
//! cancellation, recording, tool calls, and the official `openai` Python client.

mod cancellation;
mod endpoints;
mod errors;
mod forced_tools;
mod helpers;
mod openai_client;
mod recording;
mod request_guard;
mod streaming;
mod tools;
