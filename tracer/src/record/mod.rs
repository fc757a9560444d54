//! The vocabulary of what is recorded: plain serde data, no logic beyond
//! small accessors. Stored as JSON; fields added later must be optional.

pub mod gpu;
pub mod growth;
pub mod heap;
pub mod kill;
pub mod leak;
pub mod process;
pub mod published;
pub mod rows;
pub mod warning;

pub use gpu::*;
pub use growth::*;
pub use heap::*;
pub use kill::*;
pub use leak::*;
pub use process::*;
pub use rows::*;
pub use warning::*;
