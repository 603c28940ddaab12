//! Final-answer extraction and numeric equivalence, shared by the math rewards.
//!
//! Extraction ([`final_answer`]): the content of the last `\boxed{…}` / `\fbox{…}` (braces matched), else the
//! text after the last GSM8K `####`, else the text after the last "answer is" / "answer:", else the whole
//! text. Comparison ([`equivalent`]): both sides are normalised ([`normalize`]: `$`, `\$`, `%`, degrees,
//! `\text{…}` units, `\left`/`\right`, thousands separators `1,234` and `1{,}234`, `\dfrac`, a leading
//! `x =`, trailing words such as "apples" or "dollars") and parsed as exact rationals (integers, decimals,
//! scientific notation, `a/b`, `\frac{a}{b}`, mixed numbers `2\frac{1}{2}`); equal rationals are equivalent.
//! If the reference is numeric but the candidate is not, the candidate's last number is used (the
//! "final-number" fallback). Non-numeric answers are compared as normalised text.

/// An exact rational `num / den` with `den > 0`, reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    pub num: i128,
    pub den: i128,
}

impl Rational {
    pub fn new(num: i128, den: i128) -> Option<Rational> {
        if den == 0 {
            return None;
        }
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()).max(1) as i128;
        let sign = if den < 0 { -1 } else { 1 };
        Some(Rational { num: sign * num / g, den: sign * den / g })
    }

    fn add(self, other: Rational) -> Option<Rational> {
        let num = self.num.checked_mul(other.den)?.checked_add(other.num.checked_mul(self.den)?)?;
        Rational::new(num, self.den.checked_mul(other.den)?)
    }

    fn div(self, other: Rational) -> Option<Rational> {
        Rational::new(self.num.checked_mul(other.den)?, self.den.checked_mul(other.num)?)
    }

    fn neg(self) -> Rational {
        Rational { num: -self.num, den: self.den }
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The content of the last `\boxed{…}`, `\boxed x` or `\fbox{…}` in `text`.
pub fn last_boxed(text: &str) -> Option<String> {
    let (start, tag) =
        ["\\boxed", "\\fbox"].iter().filter_map(|tag| text.rfind(tag).map(|i| (i, *tag))).max_by_key(|(i, _)| *i)?;
    let rest = &text[start + tag.len()..];
    let trimmed = rest.trim_start();
    if let Some(inner) = trimmed.strip_prefix('{') {
        let mut depth = 1usize;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(inner[..i].to_owned());
                    }
                }
                _ => {}
            }
        }
        return None;
    }
    // `\boxed 5` form: up to the next `$` or whitespace.
    if rest.starts_with(' ') {
        let word: String = trimmed.chars().take_while(|c| !c.is_whitespace() && *c != '$').collect();
        return (!word.is_empty()).then_some(word);
    }
    None
}

/// The text of a response's (or reference's) final answer; see the module docs for the order.
pub fn final_answer(text: &str) -> String {
    if let Some(boxed) = last_boxed(text) {
        return boxed;
    }
    if let Some(i) = text.rfind("####") {
        return text[i + 4..].lines().next().unwrap_or("").trim().to_owned();
    }
    let lower = text.to_lowercase();
    for marker in ["answer is", "answer:"] {
        if let Some(i) = lower.rfind(marker) {
            // Lowercasing can change byte lengths outside ASCII; only trust the index when it maps back.
            if let Some(rest) = text.get(i + marker.len()..) {
                let rest = rest.trim_start_matches([':', ' ']);
                let line = rest.lines().next().unwrap_or("");
                return line.trim().trim_end_matches('.').trim().to_owned();
            }
        }
    }
    text.trim().to_owned()
}

/// Normalises an answer's text (see the module docs).
pub fn normalize(text: &str) -> String {
    let mut s = text.trim().to_owned();
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\ ", ""),
        ("~", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\displaystyle", ""),
        ("{,}", ""),
        ("\\$", ""),
        ("$", ""),
        ("\\%", ""),
        ("%", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("°", ""),
        ("\u{2212}", "-"),
        ("\\(", ""),
        ("\\)", ""),
        ("\\[", ""),
        ("\\]", ""),
    ] {
        s = s.replace(from, to);
    }
    s = strip_text_groups(&s);
    s = strip_thousands(&s);
    let mut s = s.trim().trim_end_matches('.').trim().to_owned();
    // A leading `x =` / `y=` (one variable name) carries no information for a numeric answer.
    if let Some((lhs, rhs)) = s.split_once('=') {
        let lhs = lhs.trim();
        if lhs.len() == 1 && lhs.chars().all(|c| c.is_ascii_alphabetic()) && !rhs.contains('=') {
            s = rhs.trim().to_owned();
        }
    }
    s
}

/// Removes `\text{…}`, `\textbf{…}`, `\mbox{…}`, `\mathrm{…}` wrappers: keeps their content when it is the
/// whole answer (`\text{yes}`), drops it when it follows something (`5\text{ cm}`: a unit).
fn strip_text_groups(s: &str) -> String {
    let mut out = s.to_owned();
    for tag in ["\\text", "\\textbf", "\\mbox", "\\mathrm", "\\mathbf"] {
        let open = format!("{tag}{{");
        while let Some(start) = out.find(&open) {
            let body_start = start + open.len();
            let Some(len) = out[body_start..].find('}') else { break };
            let body = out[body_start..body_start + len].to_owned();
            let before_is_empty = out[..start].trim().is_empty();
            let replacement = if before_is_empty { body } else { String::new() };
            out.replace_range(start..body_start + len + 1, &replacement);
        }
    }
    out
}

/// `1,234,567` → `1234567`; commas not followed by exactly three digits (lists, coordinates) stay.
fn strip_thousands(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == ',' {
            let before_digit = i > 0 && chars[i - 1].is_ascii_digit();
            let three = chars.get(i + 1..i + 4).is_some_and(|d| d.iter().all(char::is_ascii_digit));
            let then_end = chars.get(i + 4).is_none_or(|c| !c.is_ascii_digit());
            if before_digit && three && then_end {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Parses a normalised answer as an exact rational; trailing unit words are ignored (`18 dollars`).
pub fn parse_number(text: &str) -> Option<Rational> {
    let s = text.trim();
    let s = strip_unit_words(s);
    let s = s.replace(' ', "");
    if s.is_empty() {
        return None;
    }
    if let Some(rest) = s.strip_prefix('-') {
        return parse_unsigned(rest).map(Rational::neg);
    }
    parse_unsigned(s.strip_prefix('+').unwrap_or(&s))
}

/// `42 apples` → `42`; only when everything after the number is words.
fn strip_unit_words(s: &str) -> &str {
    let end = s.trim_end_matches(|c: char| c.is_alphabetic() || c == ' ' || c == '.' || c == '\'').len();
    let head = s[..end].trim_end();
    if head.is_empty() || !head.ends_with(|c: char| c.is_ascii_digit() || c == '}') { s } else { head }
}

fn parse_unsigned(s: &str) -> Option<Rational> {
    if let Some(frac) = s.strip_prefix("\\frac") {
        let (a, b) = frac_parts(frac)?;
        return parse_number(a)?.div(parse_number(b)?);
    }
    // Mixed number `2\frac{1}{2}`.
    if let Some((whole, frac)) = s.split_once("\\frac") {
        let whole = parse_decimal(whole)?;
        let (a, b) = frac_parts(frac)?;
        let part = parse_number(a)?.div(parse_number(b)?)?;
        return whole.add(part);
    }
    if let Some((a, b)) = s.split_once('/') {
        return parse_decimal(a)?.div(parse_decimal(b)?);
    }
    parse_decimal(s)
}

/// `{a}{b}` or `ab` (single digits, as in `\frac12`).
fn frac_parts(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('{') {
        let close = rest.find('}')?;
        let (a, rest) = (&rest[..close], &rest[close + 1..]);
        let rest = rest.strip_prefix('{')?;
        let close = rest.find('}')?;
        if !rest[close + 1..].trim().is_empty() {
            return None;
        }
        return Some((a, &rest[..close]));
    }
    let mut chars = s.char_indices();
    let (_, a) = chars.next()?;
    let (i, b) = chars.next()?;
    (a.is_ascii_digit() && b.is_ascii_digit() && s.len() == i + 1).then(|| (&s[..1], &s[1..]))
}

/// Digits with an optional `.` and exponent: `12`, `0.5`, `.5`, `3.`, `1.5e3`.
fn parse_decimal(s: &str) -> Option<Rational> {
    let s = s.trim();
    let (sign, s) = match s.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, s.strip_prefix('+').unwrap_or(s)),
    };
    let (mantissa, exponent) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) || int.len() + frac.len() > 30 {
        return None;
    }
    let digits: i128 = format!("{int}{frac}").parse().ok()?;
    let scale = exponent - frac.len() as i32;
    if scale.unsigned_abs() > 30 {
        return None;
    }
    let pow = 10i128.checked_pow(scale.unsigned_abs())?;
    if scale >= 0 { Rational::new(sign * digits.checked_mul(pow)?, 1) } else { Rational::new(sign * digits, pow) }
}

/// The last number written in `text` (`-3`, `1,234`, `2.5`), after normalisation.
pub fn last_number(text: &str) -> Option<Rational> {
    let s = normalize(text);
    let bytes: Vec<char> = s.chars().collect();
    let mut end = bytes.len();
    while end > 0 {
        if bytes[end - 1].is_ascii_digit() {
            let mut start = end;
            while start > 0 && (bytes[start - 1].is_ascii_digit() || bytes[start - 1] == '.') {
                start -= 1;
            }
            if start > 0 && bytes[start - 1] == '-' {
                start -= 1;
            }
            let token: String = bytes[start..end].iter().collect();
            return parse_decimal(token.trim_start_matches('.'));
        }
        end -= 1;
    }
    None
}

/// Whether a candidate answer matches a reference answer (both already extracted with [`final_answer`]).
pub fn equivalent(candidate: &str, reference: &str) -> bool {
    let (c, r) = (normalize(candidate), normalize(reference));
    if let Some(truth) = parse_number(&r) {
        return parse_number(&c).or_else(|| last_number(&c)) == Some(truth);
    }
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_lowercase();
    !c.is_empty() && squash(&c) == squash(&r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Option<Rational> {
        parse_number(&normalize(s))
    }

    #[test]
    fn parses_numbers_exactly() {
        let half = Rational::new(1, 2);
        for s in ["0.5", ".5", "1/2", "\\frac{1}{2}", "\\dfrac{1}{2}", "\\frac12", "50e-2", "0.50", "+0.5"] {
            assert_eq!(num(s), half, "{s}");
        }
        assert_eq!(num("-\\frac{3}{4}"), Rational::new(-3, 4));
        assert_eq!(num("2\\frac{1}{2}"), Rational::new(5, 2));
        assert_eq!(num("1,234,567"), Rational::new(1_234_567, 1));
        assert_eq!(num("1{,}000"), Rational::new(1000, 1));
        assert_eq!(num("\\$18.00"), Rational::new(18, 1));
        assert_eq!(num("18 dollars"), Rational::new(18, 1));
        assert_eq!(num("45%"), Rational::new(45, 1));
        assert_eq!(num("90^\\circ"), Rational::new(90, 1));
        assert_eq!(num("5\\text{ cm}"), Rational::new(5, 1));
        assert_eq!(num("x = 7"), Rational::new(7, 1));
        assert_eq!(num("\u{2212}4"), Rational::new(-4, 1));
        assert_eq!(num("1/0"), None);
        assert_eq!(num("1, 2, 3"), None);
        assert_eq!(num("(1,2)"), None);
        assert_eq!(num("x^2"), None);
        assert_eq!(num(""), None);
        assert_eq!(num("12345678901234567890123456789012345"), None);
    }

    #[test]
    fn extracts_final_answers() {
        assert_eq!(final_answer("so \\boxed{3} then \\boxed{\\frac{1}{2}}."), "\\frac{1}{2}");
        assert_eq!(final_answer("nested \\boxed{\\frac{a}{b}+1}"), "\\frac{a}{b}+1");
        assert_eq!(final_answer("\\fbox{7}"), "7");
        assert_eq!(final_answer("$\\boxed 9$"), "9");
        assert_eq!(final_answer("Natalia sold 48/2 = 24 clips.\n#### 72"), "72");
        assert_eq!(final_answer("Thus the answer is 42."), "42");
        assert_eq!(final_answer("Answer: 13 cats"), "13 cats");
        assert_eq!(final_answer("no marker 5"), "no marker 5");
        assert_eq!(final_answer("unclosed \\boxed{3"), "unclosed \\boxed{3");
    }

    #[test]
    fn equivalence() {
        assert!(equivalent("0.5", "1/2"));
        assert!(equivalent("72.0", "72"));
        assert!(equivalent("$1,000", "1000"));
        assert!(equivalent("We get 3 + 4 = 7", "7"));
        assert!(!equivalent("0.333", "\\frac{1}{3}"));
        assert!(!equivalent("1000001", "1000000"));
        assert!(!equivalent("", "5"));
        assert!(equivalent("\\text{Yes}", "yes"));
        assert!(equivalent("(1, 2)", "(1,2)"));
        assert!(!equivalent("", ""));
        assert!(!equivalent("-5", "5"));
    }

    #[test]
    fn last_number_fallback() {
        assert_eq!(last_number("it costs $1,250 in total, and 3.5 more"), Rational::new(7, 2));
        assert_eq!(last_number("temperature -3"), Rational::new(-3, 1));
        assert_eq!(last_number("nothing"), None);
    }
}
