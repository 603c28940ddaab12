//! How an error reads to the user: the `anyhow` chain, each cause once.
//!
//! The runtime's error types name what failed and usually put their cause's text into their own message
//! (`` `t.jsonl` line 2: invalid JSON: EOF while parsing ``) while also returning it from `source()`, as
//! `thiserror`'s `#[from]` does. anyhow's alternate form (`{:#}`) then prints each level after the one that
//! already quoted it, so one cause read two or three times. Dropping a cause whose text the message so far
//! already holds keeps every level that adds something and loses nothing.

/// The error and its causes, joined by `: `, skipping a cause already quoted by a level above it.
pub(crate) fn chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("`t.jsonl` line 2: invalid JSON: {source}")]
    struct Line {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    enum Run {
        #[error(transparent)]
        Buffer(#[from] Line),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("taskset `train`: {0}")]
    struct Taskset(#[source] Run);

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::other("EOF while parsing");
        let error = anyhow::Error::new(Taskset(Run::Buffer(Line { source: io })));
        assert_eq!(format!("{error:#}").matches("EOF while parsing").count(), 3, "{error:#}");
        assert_eq!(chain(&error), "taskset `train`: `t.jsonl` line 2: invalid JSON: EOF while parsing");
    }

    #[test]
    fn causes_that_add_something_are_kept() {
        let error = anyhow::Error::new(std::io::Error::other("permission denied"))
            .context("cannot write `out/meta.json`")
            .context("checkpoint step 5");
        assert_eq!(chain(&error), "checkpoint step 5: cannot write `out/meta.json`: permission denied");
    }
}
