//! `${VAR}` expansion in server definitions.
//!
//! `${NAME}` is replaced by the environment variable `NAME`; `$${` is a literal `${`. A `$` not
//! followed by `{` is kept as written, so `$HOME` and `a$b` pass through unchanged (toolwarden
//! starts servers without a shell; only the braced form expands).

/// Why a string could not be expanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ExpandError {
    /// `${NAME}` where `NAME` is not set.
    Unset(String),
    /// `${` without its `}`.
    Unterminated,
    /// `${...}` whose content is not a variable name.
    BadName(String),
}

impl ExpandError {
    /// What is wrong and what would be right.
    pub(crate) fn message(&self) -> String {
        match self {
            Self::Unset(name) => format!(
                "environment variable {name} is not set (used as ${{{name}}}); set it, or write $${{{name}}} for a literal \"${{{name}}}\""
            ),
            Self::Unterminated => {
                "\"${\" without a closing \"}\": write ${NAME}, or $${ for a literal \"${\""
                    .to_owned()
            }
            Self::BadName(name) => format!(
                "${{{name}}} is not a variable name: expected letters, digits and _ (not starting with a digit), or $${{ for a literal \"${{\""
            ),
        }
    }
}

/// Expands every `${NAME}` of `s` from `env`.
pub(crate) fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after.find('}').ok_or(ExpandError::Unterminated)?;
            let name = &after[..end];
            if !is_var_name(name) {
                return Err(ExpandError::BadName(name.to_owned()));
            }
            let value = env(name).ok_or_else(|| ExpandError::Unset(name.to_owned()))?;
            out.push_str(&value);
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
