//! placeholder
pub use lens_core::*;
