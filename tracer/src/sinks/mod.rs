//! Where decoded events go.

pub mod jsonl;
