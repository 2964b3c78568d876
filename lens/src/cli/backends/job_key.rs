//! The job key of the TCP rank processes this program starts: random, and handed over in
//! a file only this user can read. Used by the demo's and the bench's launchers alike.

/// `bytes` random bytes as hex: a job key.
pub(crate) fn random_hex(bytes: usize) -> Result<String, String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness for a job key: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The job key of spawned ranks, in a file only this user can read (not in the
/// environment, which child processes inherit); removed when dropped.
pub(crate) struct KeyFile(pub(crate) std::path::PathBuf);

impl KeyFile {
    pub(crate) fn new(key: &str) -> Result<KeyFile, String> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = std::env::temp_dir().join(format!(
            "lens-demo-{}-{}.key",
            std::process::id(),
            &key[..8]
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot write the job key file {}: {e}", path.display()))?;
        f.write_all(key.as_bytes())
            .map_err(|e| format!("cannot write the job key file {}: {e}", path.display()))?;
        Ok(KeyFile(path))
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
