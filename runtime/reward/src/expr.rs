//! A tiny arithmetic evaluator for countdown equations — never `eval`.
//!
//! Grammar (Python's meaning for each operator, since Trinity-RFT evaluates these strings with Python):
//! `expr := term (('+'|'-') term)*`, `term := unary (('*'|'/'|'//') unary)*`,
//! `unary := ('+'|'-') unary | power`, `power := atom ('**' unary)?`, `atom := number | '(' expr ')'`.
//! `/` is true division, `//` floor division, `**` binds tighter than unary minus on its left
//! (`-2**2 = -4`) and is right-associative. Division by zero, overflow to infinity, implicit multiplication
//! and any other character are errors (the caller scores them like Python's exceptions). Nesting is limited
//! so a hostile string cannot overflow the stack.

const MAX_DEPTH: usize = 64;

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExprError {
    #[error("unexpected `{found}` at byte {at}")]
    Unexpected { found: String, at: usize },
    #[error("division by zero")]
    DivisionByZero,
    #[error("result is not finite")]
    NotFinite,
    #[error("nested too deeply")]
    TooDeep,
}

/// Evaluates an arithmetic expression over numbers, `+ - * / // **` and parentheses.
pub fn evaluate(text: &str) -> Result<f64, ExprError> {
    let mut parser = Parser { bytes: text.as_bytes(), pos: 0, depth: 0 };
    let value = parser.expr()?;
    parser.skip_space();
    if parser.pos != parser.bytes.len() {
        return Err(parser.unexpected());
    }
    if value.is_finite() { Ok(value) } else { Err(ExprError::NotFinite) }
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while self.bytes.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        if self.bytes[self.pos..].starts_with(token.as_bytes()) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn unexpected(&self) -> ExprError {
        let found = match self.bytes.get(self.pos) {
            Some(_) => {
                String::from_utf8_lossy(&self.bytes[self.pos..(self.pos + 1).min(self.bytes.len())]).into_owned()
            }
            None => "end of input".to_owned(),
        };
        ExprError::Unexpected { found, at: self.pos }
    }

    fn enter(&mut self) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH { Err(ExprError::TooDeep) } else { Ok(()) }
    }

    fn expr(&mut self) -> Result<f64, ExprError> {
        self.enter()?;
        let mut value = self.term()?;
        loop {
            if self.eat("+") {
                value += self.term()?;
            } else if self.eat("-") {
                value -= self.term()?;
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(value)
    }

    fn term(&mut self) -> Result<f64, ExprError> {
        let mut value = self.unary()?;
        loop {
            // `power` has consumed any `**` already; `//` must be tried before `/`.
            if self.eat("*") {
                value *= self.unary()?;
            } else if self.eat("//") {
                let rhs = self.unary()?;
                if rhs == 0.0 {
                    return Err(ExprError::DivisionByZero);
                }
                value = (value / rhs).floor();
            } else if self.eat("/") {
                let rhs = self.unary()?;
                if rhs == 0.0 {
                    return Err(ExprError::DivisionByZero);
                }
                value /= rhs;
            } else {
                break;
            }
        }
        Ok(value)
    }

    fn unary(&mut self) -> Result<f64, ExprError> {
        self.enter()?;
        let value = if self.eat("-") {
            -self.unary()?
        } else if self.eat("+") {
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Ok(value)
    }

    fn power(&mut self) -> Result<f64, ExprError> {
        let base = self.atom()?;
        if self.eat("**") {
            let exponent = self.unary()?;
            if base == 0.0 && exponent < 0.0 {
                return Err(ExprError::DivisionByZero);
            }
            return Ok(base.powf(exponent));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<f64, ExprError> {
        match self.peek() {
            Some(b'(') => {
                self.pos += 1;
                let value = self.expr()?;
                if !self.eat(")") {
                    return Err(self.unexpected());
                }
                Ok(value)
            }
            Some(c) if c.is_ascii_digit() || c == b'.' => {
                let start = self.pos;
                while self.bytes.get(self.pos).is_some_and(|c| c.is_ascii_digit() || *c == b'.') {
                    self.pos += 1;
                }
                let text = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or("");
                text.parse::<f64>().map_err(|_| ExprError::Unexpected { found: text.to_owned(), at: start })
            }
            _ => Err(self.unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_semantics() {
        assert_eq!(evaluate("1 + 2 * 3").unwrap(), 7.0);
        assert_eq!(evaluate("(1 + 2) * 3").unwrap(), 9.0);
        assert_eq!(evaluate("7 / 2").unwrap(), 3.5);
        assert_eq!(evaluate("7 // 2").unwrap(), 3.0);
        assert_eq!(evaluate("-7 // 2").unwrap(), -4.0);
        assert_eq!(evaluate("2 ** 3 ** 2").unwrap(), 512.0);
        assert_eq!(evaluate("-2 ** 2").unwrap(), -4.0);
        assert_eq!(evaluate("2 ** -1").unwrap(), 0.5);
        assert_eq!(evaluate("10 - 4 - 3").unwrap(), 3.0);
        assert_eq!(evaluate("--3").unwrap(), 3.0);
        assert_eq!(evaluate(" 1.5 * 2 ").unwrap(), 3.0);
        assert!((evaluate("1/3*3").unwrap() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn errors_instead_of_panics() {
        assert_eq!(evaluate("1 / 0"), Err(ExprError::DivisionByZero));
        assert_eq!(evaluate("1 // (2 - 2)"), Err(ExprError::DivisionByZero));
        assert!(evaluate("2(3)").is_err());
        assert!(evaluate("(1 + 2").is_err());
        assert!(evaluate("").is_err());
        assert!(evaluate("1 +").is_err());
        assert!(evaluate("1..2").is_err());
        assert!(evaluate("__import__('os')").is_err());
        assert_eq!(evaluate("10 ** 400"), Err(ExprError::NotFinite));
        assert_eq!(evaluate(&"(".repeat(10_000)), Err(ExprError::TooDeep));
        assert_eq!(evaluate(&"-".repeat(10_000)), Err(ExprError::TooDeep));
    }
}
