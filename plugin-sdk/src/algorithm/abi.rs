//! The binary interface between trinity and an algorithm library, on `abi_stable`. This is the only file that
//! names abi_stable, so the ABI crate can be swapped here without touching plugins' source or the host.
//!
//! Shape: a library exports abi_stable's root-module header (the `algorithm_library!` macro writes it). Its root
//! module has two functions: `versions` (SDK, tch and libtorch the library was built with) and `describe` (the
//! library's name, version and components). Each component carries its kind, name, documentation, argument
//! defaults (JSON text), an opaque context (the author's Rust function) and one `extern "C"` entry point for its
//! kind. The host loads every file on its own ([`load`], through `lib_header_from_path`, never abi_stable's
//! per-type cached `RootModule::load_from_file`), checks the SDK version, the root module's layout and the
//! tch/libtorch versions, and only then calls anything.
//!
//! Ownership rules for tensors, which cross as raw libtorch handles (both sides link the same shared libtorch):
//! * [`TensorRef`]: lent for the duration of one call; the receiver wraps it in `ManuallyDrop` and never frees it.
//! * [`TensorBox`]: ownership moves to the receiver, which frees it (through its own tch glue, which is the same
//!   version — checked at load).
//!
//! Every entry point runs the author's function under `catch_unwind`; a panic comes back as an error string,
//! never as an unwind across `extern "C"` (which would abort the host).

use std::any::Any;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use abi_stable::library::{CheckTypeLayout, LibraryError, RootModule, lib_header_from_path};
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RErr, ROk, ROption, RResult, RSlice, RStr, RString, RVec, Tuple2};
use abi_stable::{StableAbi, declare_root_module_statics, package_version_strings};
use serde_json::{Map, Value};
use tch::Tensor;
use torch_sys::C_tensor;

use super::compat::{SDK_VERSION, Versions, sdk_compatible, sdk_range};
use super::component::{Advantages, Args, Batch, Body, Component, ComponentKind, Error, Loss, Metrics, Preset};

/// What the `algorithm_library!` macro needs, re-exported so plugins never name abi_stable themselves.
#[doc(hidden)]
pub mod export {
    pub use abi_stable::library::{LibHeader, RootModuleResult};

    /// abi_stable's exported symbol for the root-module header. The macro spells the same string literally
    /// (attributes take no constants); a unit test keeps the two equal.
    pub const LOADER_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

    pub use super::{header, root_module_result};
}

/// A tensor lent for one call: the receiver must not free it.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy)]
pub struct TensorRef<'a> {
    ptr: *mut c_void,
    _lent: PhantomData<&'a ()>,
}

impl<'a> TensorRef<'a> {
    fn lend(t: &'a Tensor) -> Self {
        TensorRef { ptr: t.as_ptr() as *mut c_void, _lent: PhantomData }
    }

    /// The lent tensor as a `tch::Tensor` that is never dropped (the lender frees it).
    fn borrow(self) -> ManuallyDrop<Tensor> {
        // SAFETY: `ptr` came from `Tensor::as_ptr` on the other side of this call and stays valid until the call
        // returns; the same tch glue version (checked at load) gives `C_tensor` the same meaning on both sides,
        // and `ManuallyDrop` keeps us from freeing what we did not create.
        ManuallyDrop::new(unsafe { Tensor::from_ptr(self.ptr as *mut C_tensor) })
    }
}

/// A tensor handed over: the receiver owns and frees it.
#[repr(transparent)]
#[derive(StableAbi)]
pub struct TensorBox {
    ptr: *mut c_void,
}

impl TensorBox {
    fn new(t: Tensor) -> Self {
        let mut t = ManuallyDrop::new(t);
        TensorBox { ptr: t.as_mut_ptr() as *mut c_void }
    }

    fn into_tensor(self) -> Tensor {
        // SAFETY: the sender built `ptr` with `TensorBox::new`, which gave up its ownership; both sides run the
        // same tch glue and libtorch (checked at load), so freeing it here is freeing it with its own allocator.
        unsafe { Tensor::from_ptr(self.ptr as *mut C_tensor) }
    }
}

/// The author's function behind a component, opaque to the host, which only hands it back to the library's own
/// entry point.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy)]
pub struct Ctx(*const c_void);

// SAFETY: a `Ctx` is the address of a function in a library that is never unloaded; it is immutable and only
// ever called, so sharing it between threads is sound.
unsafe impl Send for Ctx {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ctx {}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ctx({:p})", self.0)
    }
}

/// A batch as it crosses: token fields lent as tensors, row fields as slices.
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiBatch<'a> {
    action_mask: TensorRef<'a>,
    logprob: ROption<TensorRef<'a>>,
    old_logprob: ROption<TensorRef<'a>>,
    ref_logprob: ROption<TensorRef<'a>>,
    advantages: ROption<TensorRef<'a>>,
    token_level_rewards: ROption<TensorRef<'a>>,
    values: ROption<TensorRef<'a>>,
    entropy: ROption<TensorRef<'a>>,
    teacher_logprob: ROption<TensorRef<'a>>,
    reward: ROption<RSlice<'a, f64>>,
    reward_baselines: ROption<RSlice<'a, f64>>,
    group_id: ROption<RSlice<'a, RStr<'a>>>,
    run_id: ROption<RSlice<'a, RStr<'a>>>,
    step: ROption<RSlice<'a, i64>>,
    expert_mask: ROption<RSlice<'a, bool>>,
}

type FfiMetrics = RVec<Tuple2<RString, f64>>;

/// A loss handed back: a scalar tensor and metrics.
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiLoss {
    loss: TensorBox,
    metrics: FfiMetrics,
}

/// Advantages handed back.
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiAdvantages {
    advantages: TensorBox,
    returns: TensorBox,
    metrics: FfiMetrics,
    rows: ROption<RVec<i64>>,
}

// The entry points' types, spelled out again in `FfiComponent` because abi_stable's derive only describes a
// function pointer it sees written in a field.
type AdvantageCall = extern "C" fn(Ctx, &FfiBatch<'_>, RStr<'_>) -> RResult<FfiAdvantages, RString>;
type PolicyLossCall = extern "C" fn(Ctx, &FfiBatch<'_>, RStr<'_>) -> RResult<FfiLoss, RString>;
type KlCall =
    extern "C" fn(Ctx, TensorRef<'_>, TensorRef<'_>, ROption<TensorRef<'_>>, RStr<'_>) -> RResult<TensorBox, RString>;
type EntropyCall = extern "C" fn(Ctx, &FfiBatch<'_>, RStr<'_>, RStr<'_>) -> RResult<FfiLoss, RString>;

/// One exported component. Exactly the entry point of its kind is set (none for presets).
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiComponent {
    kind: u8,
    name: RString,
    doc: RString,
    /// JSON object: accepted argument → default.
    args: RString,
    compute_in_trainer: bool,
    /// JSON object of the preset (presets only, else empty).
    preset: RString,
    ctx: Ctx,
    advantage: Option<extern "C" fn(Ctx, &FfiBatch<'_>, RStr<'_>) -> RResult<FfiAdvantages, RString>>,
    policy_loss: Option<extern "C" fn(Ctx, &FfiBatch<'_>, RStr<'_>) -> RResult<FfiLoss, RString>>,
    #[allow(clippy::type_complexity)]
    kl: Option<
        extern "C" fn(
            Ctx,
            TensorRef<'_>,
            TensorRef<'_>,
            ROption<TensorRef<'_>>,
            RStr<'_>,
        ) -> RResult<TensorBox, RString>,
    >,
    entropy: Option<extern "C" fn(Ctx, &FfiBatch<'_>, RStr<'_>, RStr<'_>) -> RResult<FfiLoss, RString>>,
}

/// What a library says about itself.
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiLibrary {
    name: RString,
    version: RString,
    components: RVec<FfiComponent>,
}

/// The versions a library was built with.
#[repr(C)]
#[derive(StableAbi)]
pub struct FfiVersions {
    sdk: RStr<'static>,
    tch: RStr<'static>,
    libtorch: RStr<'static>,
}

/// The root module. Fields may only be appended (after `describe`, as new prefix fields), never changed.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = RootRef)))]
#[sabi(missing_field(panic))]
pub struct Root {
    versions: extern "C" fn() -> FfiVersions,
    #[sabi(last_prefix_field)]
    describe: extern "C" fn() -> RResult<FfiLibrary, RString>,
}

impl RootModule for RootRef {
    declare_root_module_statics! {RootRef}
    const BASE_NAME: &'static str = "trinity_algorithm";
    const NAME: &'static str = "trinity algorithm library";
    // The SDK's own version: abi_stable refuses incompatible ones too, after our clearer check in `load`.
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

// ---------------------------------------------------------------------------------------------------------------
// Library side.

/// What the library registered through the macro; one per library, since each library links its own SDK copy.
struct Registration {
    name: &'static str,
    version: &'static str,
    components: fn() -> Vec<Component>,
}

static REGISTRATION: OnceLock<Registration> = OnceLock::new();

/// The root-module header a library exports (called by `algorithm_library!` in a `static` initializer).
#[doc(hidden)]
pub const fn header(loader: extern "C" fn() -> export::RootModuleResult) -> export::LibHeader {
    // SAFETY: `loader` is the macro's function, which returns `root_module_result`, i.e. a `RootRef` erased by
    // abi_stable's own `__call_root_module_loader`, the type named here.
    unsafe { export::LibHeader::from_constructor::<RootRef>(loader, CheckTypeLayout::Yes) }
}

/// Builds the root module the first time the host asks for it.
#[doc(hidden)]
pub fn root_module_result(
    name: &'static str,
    version: &'static str,
    components: fn() -> Vec<Component>,
) -> export::RootModuleResult {
    let _ = REGISTRATION.set(Registration { name, version, components });
    abi_stable::library::__call_root_module_loader(root_module)
}

fn root_module() -> RootRef {
    Root { versions, describe }.leak_into_prefix()
}

extern "C" fn versions() -> FfiVersions {
    FfiVersions {
        sdk: RStr::from_str(SDK_VERSION),
        tch: RStr::from_str(super::compat::TCH_VERSION),
        libtorch: RStr::from_str(super::compat::LIBTORCH_VERSION),
    }
}

extern "C" fn describe() -> RResult<FfiLibrary, RString> {
    guard(|| {
        let registration = REGISTRATION.get().ok_or_else(|| Error::new("the library was not initialized"))?;
        let components = (registration.components)().into_iter().map(to_ffi).collect();
        Ok(FfiLibrary { name: registration.name.into(), version: registration.version.into(), components })
    })
}

fn to_ffi(c: Component) -> FfiComponent {
    let kind = c.kind();
    let mut ffi = FfiComponent {
        kind: kind.code(),
        name: c.name.as_str().into(),
        doc: c.doc.as_str().into(),
        args: Value::Object(c.args).to_string().into(),
        compute_in_trainer: c.compute_in_trainer,
        preset: c.preset.map(|p| p.to_json().to_string()).unwrap_or_default().into(),
        ctx: Ctx(std::ptr::null()),
        advantage: None,
        policy_loss: None,
        kl: None,
        entropy: None,
    };
    match c.body {
        Body::Preset => {}
        Body::Advantage(f) => {
            (ffi.ctx, ffi.advantage) = (Ctx(f as *const c_void), Some(advantage_entry as AdvantageCall))
        }
        Body::PolicyLoss(f) => {
            (ffi.ctx, ffi.policy_loss) = (Ctx(f as *const c_void), Some(policy_loss_entry as PolicyLossCall))
        }
        Body::Kl(f) => (ffi.ctx, ffi.kl) = (Ctx(f as *const c_void), Some(kl_entry as KlCall)),
        Body::Entropy(f) => (ffi.ctx, ffi.entropy) = (Ctx(f as *const c_void), Some(entropy_entry as EntropyCall)),
    }
    ffi
}

/// Runs an author's function, turning its error or panic into the error string that crosses the boundary.
fn guard<T>(body: impl FnOnce() -> Result<T, Error>) -> RResult<T, RString> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => ROk(value),
        Ok(Err(e)) => RErr(e.message().into()),
        Err(payload) => RErr(format!("panicked: {}", panic_message(payload.as_ref())).into()),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string panic payload")
}

/// The tensors and strings of a lent batch, held for the duration of one call.
struct Lent<'a> {
    action_mask: ManuallyDrop<Tensor>,
    tensors: [Option<ManuallyDrop<Tensor>>; 8],
    group_id: Option<Vec<&'a str>>,
    run_id: Option<Vec<&'a str>>,
    ffi: &'a FfiBatch<'a>,
}

impl<'a> Lent<'a> {
    fn new(b: &'a FfiBatch<'a>) -> Self {
        let t = |x: &ROption<TensorRef<'a>>| x.as_ref().into_option().map(|r| r.borrow());
        let strings = |x: &'a ROption<RSlice<'a, RStr<'a>>>| {
            x.as_ref().into_option().map(|s| s.iter().map(|r| r.as_str()).collect::<Vec<&'a str>>())
        };
        Lent {
            action_mask: b.action_mask.borrow(),
            tensors: [
                t(&b.logprob),
                t(&b.old_logprob),
                t(&b.ref_logprob),
                t(&b.advantages),
                t(&b.token_level_rewards),
                t(&b.values),
                t(&b.entropy),
                t(&b.teacher_logprob),
            ],
            group_id: strings(&b.group_id),
            run_id: strings(&b.run_id),
            ffi: b,
        }
    }

    fn batch(&self) -> Batch<'_> {
        let t = |i: usize| self.tensors[i].as_deref();
        let b = self.ffi;
        Batch {
            action_mask: &self.action_mask,
            logprob: t(0),
            old_logprob: t(1),
            ref_logprob: t(2),
            advantages: t(3),
            token_level_rewards: t(4),
            values: t(5),
            entropy: t(6),
            teacher_logprob: t(7),
            reward: b.reward.as_ref().into_option().map(|s| s.as_slice()),
            reward_baselines: b.reward_baselines.as_ref().into_option().map(|s| s.as_slice()),
            group_id: self.group_id.as_deref(),
            run_id: self.run_id.as_deref(),
            step: b.step.as_ref().into_option().map(|s| s.as_slice()),
            expert_mask: b.expert_mask.as_ref().into_option().map(|s| s.as_slice()),
        }
    }
}

fn ffi_metrics(m: Metrics) -> FfiMetrics {
    m.into_iter().map(|(k, v)| Tuple2(RString::from(k), v)).collect()
}

fn ffi_loss(l: Loss) -> FfiLoss {
    FfiLoss { loss: TensorBox::new(l.loss), metrics: ffi_metrics(l.metrics) }
}

extern "C" fn advantage_entry(ctx: Ctx, batch: &FfiBatch<'_>, args: RStr<'_>) -> RResult<FfiAdvantages, RString> {
    guard(|| {
        // SAFETY: `to_ffi` stored this address from an `AdvantageFn` next to this very entry point, and the host
        // hands each component's context back only to that component's entry point.
        let f = unsafe { std::mem::transmute::<*const c_void, super::component::AdvantageFn>(ctx.0) };
        let args = Args::parse(args.as_str())?;
        let lent = Lent::new(batch);
        let out = f(&lent.batch(), &args)?;
        Ok(FfiAdvantages {
            advantages: TensorBox::new(out.advantages),
            returns: TensorBox::new(out.returns),
            metrics: ffi_metrics(out.metrics),
            rows: out.rows.map(RVec::from).into(),
        })
    })
}

extern "C" fn policy_loss_entry(ctx: Ctx, batch: &FfiBatch<'_>, args: RStr<'_>) -> RResult<FfiLoss, RString> {
    guard(|| {
        // SAFETY: as in `advantage_entry`, for a `PolicyLossFn`.
        let f = unsafe { std::mem::transmute::<*const c_void, super::component::PolicyLossFn>(ctx.0) };
        let args = Args::parse(args.as_str())?;
        let lent = Lent::new(batch);
        f(&lent.batch(), &args).map(ffi_loss)
    })
}

extern "C" fn kl_entry(
    ctx: Ctx,
    logprob: TensorRef<'_>,
    reference: TensorRef<'_>,
    old: ROption<TensorRef<'_>>,
    args: RStr<'_>,
) -> RResult<TensorBox, RString> {
    guard(|| {
        // SAFETY: as in `advantage_entry`, for a `KlFn`.
        let f = unsafe { std::mem::transmute::<*const c_void, super::component::KlFn>(ctx.0) };
        let args = Args::parse(args.as_str())?;
        let (logprob, reference) = (logprob.borrow(), reference.borrow());
        let old = old.into_option().map(TensorRef::borrow);
        f(&logprob, &reference, old.as_deref(), &args).map(TensorBox::new)
    })
}

extern "C" fn entropy_entry(
    ctx: Ctx,
    batch: &FfiBatch<'_>,
    mode: RStr<'_>,
    args: RStr<'_>,
) -> RResult<FfiLoss, RString> {
    guard(|| {
        // SAFETY: as in `advantage_entry`, for an `EntropyLossFn`.
        let f = unsafe { std::mem::transmute::<*const c_void, super::component::EntropyLossFn>(ctx.0) };
        let args = Args::parse(args.as_str())?;
        let lent = Lent::new(batch);
        f(&lent.batch(), mode.as_str(), &args).map(ffi_loss)
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

/// Why a library could not be loaded. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not a loadable trinity algorithm library (missing file, not a shared library, no root module).
    #[error("cannot load algorithm library {}: {message}", path.display())]
    Open { path: PathBuf, message: String },

    /// Built against an SDK this host cannot talk to.
    #[error(
        "algorithm library {} was built against trinity-plugin-sdk {library}, but this trinity accepts {accepted}; \
         rebuild it against trinity-plugin-sdk {host}",
        path.display()
    )]
    Sdk { path: PathBuf, library: String, host: String, accepted: String },

    /// abi_stable's layout check (or another of its checks) failed.
    #[error("algorithm library {} does not match this trinity's ABI: {message}", path.display())]
    Abi { path: PathBuf, message: String },

    /// Built with another tch or libtorch, so tensor handles would not mean the same thing.
    #[error(
        "algorithm library {} was built with {what} {library}, but this trinity uses {what} {host}; rebuild it with \
         the same {what}",
        path.display()
    )]
    Toolchain { path: PathBuf, what: &'static str, library: String, host: String },

    /// The library's description (its component list) failed or is malformed.
    #[error("algorithm library {}: {message}", path.display())]
    Describe { path: PathBuf, message: String },
}

/// A library after load: its identity and components, ready to call.
#[derive(Debug)]
pub struct Library {
    /// The library crate's name (`CARGO_PKG_NAME`).
    pub name: String,
    /// The library crate's version.
    pub version: String,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// What the library was built with.
    pub versions: Versions,
    /// Its components, in declaration order.
    pub components: Vec<LoadedComponent>,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    None,
    Advantage(AdvantageCall),
    PolicyLoss(PolicyLossCall),
    Kl(KlCall),
    Entropy(EntropyCall),
}

/// A component of a loaded library, callable from the host.
#[derive(Debug)]
pub struct LoadedComponent {
    /// What the component is.
    pub kind: ComponentKind,
    /// The name configs use.
    pub name: String,
    /// The author's one-line description (may be empty).
    pub doc: String,
    /// Accepted arguments with their defaults.
    pub args: Map<String, Value>,
    /// For advantage functions: runs in the trainer.
    pub compute_in_trainer: bool,
    /// For presets: the preset.
    pub preset: Option<Preset>,
    ctx: Ctx,
    entry: Entry,
}

/// Loads one library file and checks it: SDK version, abi_stable's header and layout checks, tch and libtorch
/// versions, then its description. The library stays loaded for the life of the process (abi_stable never
/// unloads, since anything may still point into it).
pub fn load(path: &Path) -> Result<Library, LoadError> {
    let abi = |e: LibraryError| LoadError::Abi { path: path.to_owned(), message: e.to_string() };
    let header = lib_header_from_path(path).map_err(|e| match e {
        LibraryError::OpenError { .. } | LibraryError::GetSymbolError { .. } => {
            LoadError::Open { path: path.to_owned(), message: first_line(&e.to_string()) }
        }
        other => abi(other),
    })?;
    let library_sdk = header.version_strings().version.as_str().to_owned();
    if !sdk_compatible(SDK_VERSION, &library_sdk) {
        return Err(LoadError::Sdk {
            path: path.to_owned(),
            library: library_sdk,
            host: SDK_VERSION.to_owned(),
            accepted: sdk_range(SDK_VERSION),
        });
    }
    let root = header.init_root_module::<RootRef>().map_err(abi)?;
    let theirs = (root.versions())();
    let ours = Versions::current();
    for (what, library, host) in [
        ("tch", theirs.tch.as_str(), ours.tch.as_str()),
        ("libtorch", theirs.libtorch.as_str(), ours.libtorch.as_str()),
    ] {
        if library != host || library == "unknown" {
            return Err(LoadError::Toolchain {
                path: path.to_owned(),
                what,
                library: library.to_owned(),
                host: host.to_owned(),
            });
        }
    }
    let describe = |message: String| LoadError::Describe { path: path.to_owned(), message };
    let description = (root.describe())().into_result().map_err(|e| describe(e.into()))?;
    let components =
        description.components.into_iter().map(from_ffi).collect::<Result<Vec<_>, String>>().map_err(describe)?;
    Ok(Library {
        name: description.name.into(),
        version: description.version.into(),
        path: path.to_owned(),
        versions: Versions {
            sdk: theirs.sdk.as_str().to_owned(),
            tch: theirs.tch.as_str().to_owned(),
            libtorch: theirs.libtorch.as_str().to_owned(),
        },
        components,
    })
}

fn first_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

fn from_ffi(c: FfiComponent) -> Result<LoadedComponent, String> {
    let name: String = c.name.into();
    let kind =
        ComponentKind::from_code(c.kind).ok_or_else(|| format!("component `{name}` has unknown kind {}", c.kind))?;
    let args = match serde_json::from_str(c.args.as_str()) {
        Ok(Value::Object(m)) => m,
        _ => return Err(format!("component `{name}`: its argument defaults are not a JSON object")),
    };
    let preset = match kind {
        ComponentKind::Preset => {
            let value: Value =
                serde_json::from_str(c.preset.as_str()).map_err(|e| format!("preset `{name}` is not JSON: {e}"))?;
            Some(Preset::from_json(&value).map_err(|e| format!("preset `{name}`: {e}"))?)
        }
        _ => None,
    };
    let entry = match (kind, c.advantage, c.policy_loss, c.kl, c.entropy) {
        (ComponentKind::Preset, None, None, None, None) => Entry::None,
        (ComponentKind::AdvantageFn, Some(f), None, None, None) => Entry::Advantage(f),
        (ComponentKind::PolicyLoss, None, Some(f), None, None) => Entry::PolicyLoss(f),
        (ComponentKind::KlFn, None, None, Some(f), None) => Entry::Kl(f),
        (ComponentKind::EntropyLoss, None, None, None, Some(f)) => Entry::Entropy(f),
        _ => return Err(format!("{kind} `{name}` does not carry exactly the entry point of its kind")),
    };
    Ok(LoadedComponent {
        kind,
        name,
        doc: c.doc.into(),
        args,
        compute_in_trainer: c.compute_in_trainer,
        preset,
        ctx: c.ctx,
        entry,
    })
}

/// Lends `batch` across the boundary for the duration of `call`.
fn with_batch<R>(batch: &Batch<'_>, call: impl FnOnce(&FfiBatch<'_>) -> R) -> R {
    fn strings<'s>(x: Option<&[&'s str]>) -> Option<Vec<RStr<'s>>> {
        x.map(|s| s.iter().map(|s| RStr::from_str(s)).collect())
    }
    let (group_id, run_id) = (strings(batch.group_id), strings(batch.run_id));
    fn t(x: Option<&Tensor>) -> ROption<TensorRef<'_>> {
        x.map(TensorRef::lend).into()
    }
    let ffi = FfiBatch {
        action_mask: TensorRef::lend(batch.action_mask),
        logprob: t(batch.logprob),
        old_logprob: t(batch.old_logprob),
        ref_logprob: t(batch.ref_logprob),
        advantages: t(batch.advantages),
        token_level_rewards: t(batch.token_level_rewards),
        values: t(batch.values),
        entropy: t(batch.entropy),
        teacher_logprob: t(batch.teacher_logprob),
        reward: batch.reward.map(RSlice::from_slice).into(),
        reward_baselines: batch.reward_baselines.map(RSlice::from_slice).into(),
        group_id: group_id.as_deref().map(RSlice::from_slice).into(),
        run_id: run_id.as_deref().map(RSlice::from_slice).into(),
        step: batch.step.map(RSlice::from_slice).into(),
        expert_mask: batch.expert_mask.map(RSlice::from_slice).into(),
    };
    call(&ffi)
}

fn metrics(m: FfiMetrics) -> Metrics {
    m.into_iter().map(|Tuple2(k, v)| (k.into(), v)).collect()
}

fn loss(l: FfiLoss) -> Loss {
    Loss { loss: l.loss.into_tensor(), metrics: metrics(l.metrics) }
}

fn result<T>(r: RResult<T, RString>) -> Result<T, Error> {
    r.into_result().map_err(|e| Error::new(String::from(e)))
}

impl LoadedComponent {
    fn wrong_kind(&self, wanted: ComponentKind) -> Error {
        Error::new(format!("`{}` is a {}, not a {wanted}", self.name, self.kind))
    }

    /// Runs an advantage function; `args` are the resolved arguments.
    pub fn advantage(&self, batch: &Batch<'_>, args: &Map<String, Value>) -> Result<Advantages, Error> {
        let Entry::Advantage(f) = self.entry else { return Err(self.wrong_kind(ComponentKind::AdvantageFn)) };
        let args = Value::Object(args.clone()).to_string();
        let out = result(with_batch(batch, |b| f(self.ctx, b, RStr::from_str(&args))))?;
        Ok(Advantages {
            advantages: out.advantages.into_tensor(),
            returns: out.returns.into_tensor(),
            metrics: metrics(out.metrics),
            rows: out.rows.into_option().map(RVec::into_vec),
        })
    }

    /// Runs a policy loss.
    pub fn policy_loss(&self, batch: &Batch<'_>, args: &Map<String, Value>) -> Result<Loss, Error> {
        let Entry::PolicyLoss(f) = self.entry else { return Err(self.wrong_kind(ComponentKind::PolicyLoss)) };
        let args = Value::Object(args.clone()).to_string();
        result(with_batch(batch, |b| f(self.ctx, b, RStr::from_str(&args)))).map(loss)
    }

    /// Runs a KL estimator: per-token KL of `logprob` from `reference` (`old` for estimators that use it).
    pub fn kl(
        &self,
        logprob: &Tensor,
        reference: &Tensor,
        old: Option<&Tensor>,
        args: &Map<String, Value>,
    ) -> Result<Tensor, Error> {
        let Entry::Kl(f) = self.entry else { return Err(self.wrong_kind(ComponentKind::KlFn)) };
        let args = Value::Object(args.clone()).to_string();
        let old = old.map(TensorRef::lend).into();
        let out = f(self.ctx, TensorRef::lend(logprob), TensorRef::lend(reference), old, RStr::from_str(&args));
        result(out).map(TensorBox::into_tensor)
    }

    /// Runs an entropy loss: the unscaled aggregate and its metrics.
    pub fn entropy_loss(&self, batch: &Batch<'_>, mode: &str, args: &Map<String, Value>) -> Result<Loss, Error> {
        let Entry::Entropy(f) = self.entry else { return Err(self.wrong_kind(ComponentKind::EntropyLoss)) };
        let args = Value::Object(args.clone()).to_string();
        result(with_batch(batch, |b| f(self.ctx, b, RStr::from_str(mode), RStr::from_str(&args)))).map(loss)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn the_macro_exports_abi_stables_symbol() {
        assert_eq!(export::LOADER_SYMBOL, abi_stable::library::ROOT_MODULE_LOADER_NAME);
    }

    fn nll(batch: &Batch<'_>, args: &Args) -> Result<Loss, Error> {
        let logprob = batch.need("logprob")?;
        let scale = args.f64("scale")?;
        let loss = super::super::component::aggregate(&(-logprob * scale), batch.action_mask, "token-mean")?;
        Ok(Loss { metrics: Metrics::from([("nll".to_owned(), loss.double_value(&[]))]), loss })
    }

    fn panics(_: &Batch<'_>, _: &Args) -> Result<Loss, Error> {
        panic!("boom")
    }

    fn loaded(c: Component) -> LoadedComponent {
        from_ffi(to_ffi(c)).unwrap()
    }

    #[test]
    fn a_call_round_trips_through_the_entry_point_with_gradients() {
        let c = loaded(Component::policy_loss("nll", nll).arg("scale", 2.0));
        assert_eq!(c.args["scale"], 2.0);
        let logprob = Tensor::from_slice(&[-1.0f32, -3.0]).view([1, 2]).set_requires_grad(true);
        let mask = Tensor::ones([1, 2], (Kind::Float, Device::Cpu));
        let batch = Batch { logprob: Some(&logprob), ..Batch::new(&mask) };
        let out = c.policy_loss(&batch, &c.args).unwrap();
        assert!((out.loss.double_value(&[]) - 4.0).abs() < 1e-5);
        assert!((out.metrics["nll"] - 4.0).abs() < 1e-5);
        out.loss.backward();
        assert!((logprob.grad().double_value(&[0, 0]) + 1.0).abs() < 1e-5);
        // The lent tensor is still ours and alive.
        assert_eq!(logprob.size(), vec![1, 2]);
    }

    #[test]
    fn panics_and_errors_come_back_as_errors() {
        let mask = Tensor::ones([1, 1], (Kind::Float, Device::Cpu));
        let batch = Batch::new(&mask);
        let err = loaded(Component::policy_loss("p", panics)).policy_loss(&batch, &Map::new()).unwrap_err();
        assert!(err.message().contains("panicked: boom"), "{err}");
        let err = loaded(Component::policy_loss("nll", nll)).policy_loss(&batch, &Map::new()).unwrap_err();
        assert!(err.message().contains("`logprob`"), "{err}");
        let err = loaded(Component::policy_loss("nll", nll)).kl(&mask, &mask, None, &Map::new()).unwrap_err();
        assert!(err.message().contains("not a kl_fn"), "{err}");
    }

    #[test]
    fn presets_and_kinds_survive_the_description() {
        let preset = Preset { policy_loss_fn: Some("nll".into()), use_reference: true, ..Preset::default() };
        let c = loaded(Component::preset("mine", preset.clone()).doc("my algorithm"));
        assert_eq!((c.kind, c.doc.as_str(), c.preset), (ComponentKind::Preset, "my algorithm", Some(preset)));
    }
}
