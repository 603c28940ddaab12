//! The plugin host against real plugins: the example plugins and a hostile one, built for wasm32-wasip2 once per
//! test run, plus tiny WAT components for the version and format checks.

mod budgets;
mod hostile;
mod plugins;
mod support;
mod version;
