//! What is attached where: the eBPF object, the libraries it probes and attaching to them.
//!
//! A **probe set** ([`probe_set`]) is a library as data: how to recognise and find it, and
//! its catalog of functions. A **plan** ([`plan`]) binds one set to one library file
//! ([`library`]): the exports matched against the catalog, each probe numbered with an id
//! unique across plans. **Attaching** ([`attach`]) takes the plans, whatever the
//! library: uprobe_multi links ([`uprobe_multi`]) per traced process or for the host, or
//! per-symbol perf links. **Discovery** ([`discovery`]) plans and attaches each library
//! file where traced processes open it, while they wait.
//!
//! | file | |
//! |---|---|
//! | `probe_set.rs` | the libraries cudatrace probes (libcuda; `--gpu`'s injection library) |
//! | `library.rs` | finding a library file, reading its exports |
//! | `plan.rs` | catalog × exports → numbered probes; the `--missing-probes` policy |
//! | `attach.rs` | attaching and detaching the entry/return programs, per process or for the host |
//! | `discovery.rs` | libraries found where traced processes load them; the stops that make it race-free |
//! | `uprobe_multi.rs` | uprobe_multi links, by hand (aya 0.14 lacks them) |
//! | `object.rs` | the embedded eBPF object, loaded with this run's globals |
//! | `programs.rs` | programs by name; tracepoint and process-tree attaching |
//! | `maps.rs` | the traced-pid set, the events ring, the loss counters |
//! | `tracefs.rs` | finding tracefs, reading tracepoint formats |

pub mod attach;
pub mod discovery;
pub mod library;
pub mod maps;
pub mod object;
pub mod plan;
pub mod probe_set;
pub mod programs;
pub mod tracefs;
pub mod uprobe_multi;
