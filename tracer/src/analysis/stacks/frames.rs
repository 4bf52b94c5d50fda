//! The `stack` lines of a trace, interned: each distinct function and frame once, each
//! stack a list of frame ids, with what the readers ask of it worked out once, when its
//! line is read: its layer (the innermost `torch.nn.Module` forward), its call site (the
//! innermost frame) and the user's line (the innermost frame outside the libraries).
//!
//! docs/python-stacks.md, "What the readers make of stacks", has the rules and why.

use foldhash::HashMap;

use crate::schema::StackLine;

/// A Python function: where it is defined.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Function {
    pub file: String,
    pub qualname: String,
    pub first_line: u32,
}

/// A frame: a function and the line it was executing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: u32,
    pub line: Option<u32>,
}

/// A stack of the trace, as the readers use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// The trace's id (what call lines' `stack` names).
    pub id: u64,
    /// Frame ids, innermost first.
    pub frames: Vec<u32>,
    /// The walk stopped at the frame budget: outer frames are missing.
    pub cut: bool,
    /// The position in `frames` of the layer's frame (the innermost Module forward).
    pub layer: Option<usize>,
    /// The position in `frames` of the user's frame (the innermost outside the libraries).
    pub user: Option<usize>,
}

/// The qualified names of `torch.nn.Module`'s call machinery that call a module's forward
/// (`__call__` is `_wrapped_call_impl`, which calls `_call_impl`; `_slow_forward` while
/// tracing with TorchScript). Python 3.10 gives bare names.
const CALL_IMPLS: [&str; 8] = [
    "Module._call_impl",
    "Module._wrapped_call_impl",
    "Module._call_impl.<locals>.inner",
    "Module._slow_forward",
    "_call_impl",
    "_wrapped_call_impl",
    "inner",
    "_slow_forward",
];

/// The file of `torch.nn.Module`, wherever torch is installed.
const MODULE_FILE: &str = "torch/nn/modules/module.py";

impl Function {
    /// Whether this is a method named `forward` (qualname `Class.forward`, or `forward`
    /// on Python 3.10).
    fn is_forward(&self) -> bool {
        self.qualname == "forward" || self.qualname.ends_with(".forward")
    }

    /// Whether this is `torch.nn.Module`'s own call machinery.
    fn is_module_call(&self) -> bool {
        self.file.ends_with(MODULE_FILE) && CALL_IMPLS.contains(&self.qualname.as_str())
    }

    /// A layer's name: the class that defines the forward (`GPT2Attention` from
    /// `GPT2Attention.forward`, `Net` from `main.<locals>.Net.forward`); on Python 3.10,
    /// which has no qualified names, and for a `forward` that is a function's local (a
    /// module given a function as its forward, as torch.compile's wrappers do:
    /// `f.<locals>.forward`), `QUALNAME@FILE:FIRST_LINE` (the file's last part).
    pub fn layer_name(&self) -> String {
        match self
            .qualname
            .strip_suffix(".forward")
            .and_then(|class| class.rsplit('.').next())
        {
            Some(class) if !class.is_empty() && class != "<locals>" => class.to_owned(),
            _ => format!(
                "{}@{}:{}",
                self.qualname,
                self.file.rsplit('/').next().unwrap_or(&self.file),
                self.first_line
            ),
        }
    }
}

impl Function {
    /// A frame of this function as text: `QUALNAME (FILE:LINE)`, `QUALNAME (FILE)` where
    /// the frame has no line (the export's `stack` argument, folded stacks).
    pub fn frame_text(&self, line: Option<u32>) -> String {
        match line {
            Some(line) => format!("{} ({}:{line})", self.qualname, self.file),
            None => format!("{} ({})", self.qualname, self.file),
        }
    }
}

/// Whether `file` belongs to a library rather than to the user's own code: an installed
/// package (`site-packages/`, `dist-packages/`), PyTorch itself (a `torch/` folder, also
/// a source checkout), the standard library (`lib/python3.N/`) or a frozen module.
pub fn is_library_file(file: &str) -> bool {
    file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.contains("/torch/")
        || file.starts_with("torch/")
        || file.contains("/lib/python3.")
        || file.starts_with("<frozen ")
}

/// The position of the innermost Module forward in `functions` (innermost first): a
/// frame of a method named `forward` whose nearest caller that is either another
/// `forward` or Module's call machinery is the call machinery. Frames between the two
/// (decorators' wrappers, accelerate's hooks) are allowed; an autograd `Function.forward`
/// (called from a module's `forward` through `apply`) and a `forward` called directly
/// from another `forward` are not layers.
pub fn layer_position(functions: &[&Function]) -> Option<usize> {
    functions.iter().enumerate().find_map(|(index, function)| {
        if !function.is_forward() {
            return None;
        }
        let caller = functions[index + 1..]
            .iter()
            .find(|outer| outer.is_forward() || outer.is_module_call())?;
        caller.is_module_call().then_some(index)
    })
}

/// Every stack, function and frame of a trace, each once.
#[derive(Default)]
pub struct StackTable {
    functions: Vec<Function>,
    function_ids: HashMap<Function, u32>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    stacks: Vec<Stack>,
    /// The trace's id → index in `stacks`.
    by_id: HashMap<u64, u32>,
}

impl StackTable {
    /// A `stack` line; `false` for a second line with an id seen before, which replaces
    /// nothing (the writer never repeats one: the caller counts it).
    pub fn add(&mut self, line: &StackLine) -> bool {
        if self.by_id.contains_key(&line.id) {
            return false;
        }
        let frames: Vec<u32> = line
            .frames
            .iter()
            .map(|frame| {
                let function = Function {
                    file: frame.file.clone(),
                    qualname: frame.qualname.clone(),
                    first_line: frame.first_line,
                };
                let function = self.intern_function(function);
                self.intern_frame(Frame {
                    function,
                    line: frame.line,
                })
            })
            .collect();
        let functions: Vec<&Function> = frames
            .iter()
            .map(|frame| &self.functions[self.frames[*frame as usize].function as usize])
            .collect();
        let layer = layer_position(&functions);
        let user = functions.iter().position(|f| !is_library_file(&f.file));
        self.by_id.insert(line.id, self.stacks.len() as u32);
        self.stacks.push(Stack {
            id: line.id,
            frames,
            cut: line.cut,
            layer,
            user,
        });
        true
    }

    fn intern_function(&mut self, function: Function) -> u32 {
        if let Some(id) = self.function_ids.get(&function) {
            return *id;
        }
        let id = self.functions.len() as u32;
        self.function_ids.insert(function.clone(), id);
        self.functions.push(function);
        id
    }

    fn intern_frame(&mut self, frame: Frame) -> u32 {
        *self.frame_ids.entry(frame).or_insert_with(|| {
            self.frames.push(frame);
            self.frames.len() as u32 - 1
        })
    }

    /// The index of the stack the trace calls `id`, if its line was read.
    pub fn index(&self, id: u64) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    pub fn stacks(&self) -> &[Stack] {
        &self.stacks
    }

    pub fn stack(&self, index: u32) -> &Stack {
        &self.stacks[index as usize]
    }

    pub fn frame(&self, id: u32) -> Frame {
        self.frames[id as usize]
    }

    pub fn function(&self, id: u32) -> &Function {
        &self.functions[id as usize]
    }

    /// The function of frame `id`.
    pub fn function_of(&self, id: u32) -> &Function {
        self.function(self.frame(id).function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(file: &str, qualname: &str) -> Function {
        Function {
            file: file.into(),
            qualname: qualname.into(),
            first_line: 1,
        }
    }

    const MODULE: &str = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";

    #[test]
    fn the_innermost_forward_called_by_module_machinery_is_the_layer() {
        let linear = function(
            "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py",
            "Linear.forward",
        );
        let call_impl = function(MODULE, "Module._call_impl");
        let wrapped = function(MODULE, "Module._wrapped_call_impl");
        let block = function("/w/model.py", "Block.forward");
        let autograd = function("/w/model.py", "MyFunction.forward");
        let wrapper = function(
            "/venv/lib/python3.12/site-packages/transformers/utils/generic.py",
            "can_return_tuple.<locals>.wrapper",
        );
        let script = function("/w/run.py", "<module>");
        // Linear inside Block: Linear.
        let stack = [
            &linear, &call_impl, &wrapped, &block, &call_impl, &wrapped, &script,
        ];
        assert_eq!(layer_position(&stack), Some(0));
        // An autograd Function's forward inside Block: Block.
        let stack = [&autograd, &block, &call_impl, &wrapped, &script];
        assert_eq!(layer_position(&stack), Some(1));
        // A decorator's wrapper between the machinery and the forward.
        let stack = [&block, &wrapper, &call_impl, &wrapped, &script];
        assert_eq!(layer_position(&stack), Some(0));
        // A forward called directly, outside any module: no layer.
        assert_eq!(layer_position(&[&block, &script]), None);
        // A forward named like the machinery but in another file is not it.
        let impostor = function("/w/module.py", "Module._call_impl");
        assert_eq!(layer_position(&[&block, &impostor, &script]), None);
    }

    #[test]
    fn layers_are_named_by_their_class() {
        assert_eq!(
            function("/a.py", "GPT2Attention.forward").layer_name(),
            "GPT2Attention"
        );
        assert_eq!(
            function("/a.py", "main.<locals>.Net.forward").layer_name(),
            "Net"
        );
        // A function's local `forward`: no class to name.
        assert_eq!(
            function("/t/compile_fx.py", "compile_fx.<locals>.forward").layer_name(),
            "compile_fx.<locals>.forward@compile_fx.py:1"
        );
        // Python 3.10: no qualified name.
        assert_eq!(
            function("/w/model.py", "forward").layer_name(),
            "forward@model.py:1"
        );
    }

    #[test]
    fn library_files_are_told_from_the_users() {
        for library in [
            "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py",
            "/usr/lib/python3/dist-packages/numpy/core/x.py",
            "/home/u/src/pytorch/torch/functional.py",
            "/usr/lib/python3.12/threading.py",
            "<frozen runpy>",
        ] {
            assert!(is_library_file(library), "{library}");
        }
        for user in ["/w/model.py", "train.py", "<string>", "/home/u/lib/app.py"] {
            assert!(!is_library_file(user), "{user}");
        }
    }
}
