//! What is attached where: the eBPF object, the libraries it probes and attaching to them.
//!
//! The **loaded object** ([`loaded`]) is taken apart once, at load: the ring and the loss
//! counters go to the event loop, each map to the part that writes it, and what is left
//! (the programs) is lent to attach and detach. A **probe set** ([`probe_set`]) is a
//! library as data: how to recognise and find it, and its catalog of functions. A **plan**
//! ([`plan`]) binds one set to one library file ([`library`]): the exports matched against
//! the catalog, each probe numbered with an id unique across plans. **Attaching**
//! ([`attach`]) takes the plans, whatever the library: uprobe_multi links
//! ([`uprobe_multi`]) per traced process or for the host, or per-symbol perf links.
//! **Discovery** ([`discovery`]) plans and attaches each library file where traced
//! processes open it, while they wait ([`stops`]). Nothing here writes a trace line or
//! prints: attaching returns what it did, and `run/` turns that into `library` lines and
//! reports.
//!
//! | file | |
//! |---|---|
//! | `probe_set.rs` | the libraries cudatrace probes (libcuda; `--gpu`'s injection library) |
//! | `library.rs` | finding a library file, reading its exports |
//! | `plan.rs` | catalog × exports → numbered probes; the `--missing-probes` policy |
//! | `attach.rs` | attaching and detaching the entry/return programs, per process or for the host; what each attach left out |
//! | `discovery.rs` | the attach layer while tracing: libraries found where traced processes load them, planned, attached, linked per process; what it did, as data |
//! | `stops.rs` | the processes stopped until their probes are attached, continued on every way out |
//! | `helpers.rs` | BPF helpers older kernels lack (attach cookie, func ip), probed; without cookies the probes are named by address (`maps::identity`) |
//! | `uprobe_multi.rs` | uprobe_multi links, by hand (aya 0.14 lacks them) |
//! | `object.rs` | the embedded eBPF object, loaded with this run's globals |
//! | `loaded.rs` | the loaded object taken apart: programs, ring, counters, maps |
//! | `programs.rs` | programs by name; tracepoint and process-tree attaching |
//! | `stack_selection.rs` | `--stacks[=WHICH]`: which probes send the Python stack, by what their calls do |
//! | `stack_programs.rs` | `--stacks`: the stack programs loaded into the program array of each kind of call program |
//! | `maps.rs` | each map as its owner uses it: the traced set, the probe table, the library names, the linked and stopped processes, the ring, the loss counters |
//! | `tracefs.rs` | finding tracefs, reading tracepoint formats |

pub mod attach;
pub mod discovery;
pub mod helpers;
pub mod library;
pub mod loaded;
pub mod maps;
pub mod object;
pub mod plan;
pub mod probe_set;
pub mod programs;
pub mod stack_programs;
pub mod stack_selection;
pub mod stops;
pub mod tracefs;
pub mod uprobe_multi;
