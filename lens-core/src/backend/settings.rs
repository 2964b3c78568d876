//! One rule for every builder's settings: code, then the environment, then the default. A
//! variable that does not parse is not an error at once: it is kept under the setting it is
//! about, code that sets the setting drops it, and the builder reports the first one left
//! when it builds. TCP, MPI, NCCL, the slab options and OTLP all keep them here.

use crate::error::{Error, Result};

/// Variables that did not parse, each under its setting, in the order they were read,
/// with the variable's name where it is known: the error [`EnvErrors::check`] returns has
/// it as its `setting`.
///
/// ```
/// use lens_core::backend::EnvErrors;
///
/// let mut errors = EnvErrors::default();
/// errors.note("timeout", "LENS_TCP_TIMEOUT=\"soon\" is not a number of seconds");
/// assert!(errors.check().is_err());
/// errors.clear("timeout"); // code set the timeout: the variable no longer matters
/// assert!(errors.check().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvErrors(Vec<Noted>);

/// One variable's error: the setting it is about, the variable, why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Noted {
    setting: &'static str,
    variable: Option<String>,
    reason: String,
}

/// Whether a setting's key is itself the variable's name (MPI, NCCL and OTLP key their
/// errors by the variable; TCP by its setters' names).
fn is_variable(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

impl EnvErrors {
    /// Keeps why the variable of `setting` did not parse (replacing an earlier reason).
    pub fn note(&mut self, setting: &'static str, reason: impl std::fmt::Display) {
        let variable = is_variable(setting).then(|| setting.to_owned());
        self.keep(setting, variable, reason.to_string());
    }

    fn keep(&mut self, setting: &'static str, variable: Option<String>, reason: String) {
        self.clear(setting);
        self.0.push(Noted {
            setting,
            variable,
            reason,
        });
    }

    /// Keeps `e` under `setting`: a [`Error::Config`]'s reason as it is (and the variable
    /// it names as its `setting`), any other error's text.
    pub fn note_error(&mut self, setting: &'static str, e: Error) {
        match e {
            Error::Config {
                setting: Some(variable),
                reason,
            } => self.keep(setting, Some(variable), reason),
            Error::Config { reason, .. } => self.note(setting, reason),
            other => self.note(setting, other),
        }
    }

    /// Code set `setting`: its variable's error no longer counts.
    pub fn clear(&mut self, setting: &'static str) {
        self.0.retain(|n| n.setting != setting);
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first error kept, as an [`Error::Config`].
    ///
    /// # Errors
    /// [`Error::Config`] with the first reason kept, and its variable as the `setting`
    /// where known.
    pub fn check(&self) -> Result<()> {
        match self.0.first() {
            Some(n) => Err(Error::Config {
                setting: n.variable.clone(),
                reason: n.reason.clone(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_left_is_reported_and_code_clears_its_setting() {
        let mut e = EnvErrors::default();
        assert!(e.check().is_ok() && e.is_empty());
        e.note("a", "A is bad");
        e.note_error("b", Error::config("B is bad"));
        e.note("a", "A is worse");
        // "a" was noted again: it moved behind "b".
        let text = e.check().expect_err("errors kept").to_string();
        assert_eq!(text, "invalid configuration: B is bad", "no nesting");
        e.clear("b");
        assert!(
            e.check()
                .expect_err("a is left")
                .to_string()
                .ends_with("A is worse")
        );
        e.clear("a");
        assert!(e.check().is_ok());
    }

    #[test]
    fn the_error_names_the_variable_where_it_is_known() {
        let setting_of = |e: &EnvErrors| match e.check() {
            Err(Error::Config { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        let mut e = EnvErrors::default();
        e.note("timeout", "LENS_TCP_TIMEOUT=\"x\" is not a number");
        assert_eq!(setting_of(&e), None, "a setter's name is not a variable");
        e.note_error("timeout", Error::config_for("LENS_TCP_TIMEOUT", "x"));
        assert_eq!(setting_of(&e).as_deref(), Some("LENS_TCP_TIMEOUT"));
        let mut e = EnvErrors::default();
        e.note("LENS_MPI_TRANSFER", "no such way");
        assert_eq!(setting_of(&e).as_deref(), Some("LENS_MPI_TRANSFER"));
    }
}
