//! What a rank saw while its group formed, for the error when the group does not form.

/// Causes worth reporting when a join fails.
#[derive(Debug, Default)]
pub(crate) struct Diagnostics {
    /// What authenticated peers disagreed about (world size, a group already formed).
    pub notes: Vec<String>,
    /// Connections whose KNOCK or HELLO failed the key check: a rank with another key, or
    /// a stranger (whose frames anyone can forge), so they are counted, never blamed.
    pub bad_key: usize,
    /// Where the first few of those came from.
    pub bad_key_from: Vec<String>,
}

impl Diagnostics {
    pub(crate) fn note(&mut self, s: String) {
        if !self.notes.contains(&s) && self.notes.len() < 8 {
            self.notes.push(s);
        }
    }

    /// The connections that failed the key check, for an error message; empty when there
    /// were none.
    pub(crate) fn bad_key_summary(&self) -> String {
        if self.bad_key == 0 {
            return String::new();
        }
        format!(
            "{} connection(s) failed the key check (a rank with another job key, or a stranger) from {}",
            self.bad_key,
            self.bad_key_from.join(", ")
        )
    }
}
