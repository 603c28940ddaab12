//! A process group: the ranks that run collectives together, on Gloo for CPU tensors (and NCCL for CUDA tensors
//! with the `nccl` feature and [`GroupOptions::nccl`]; otherwise a CUDA tensor is copied to host memory, goes
//! through Gloo and is copied back).
//!
//! Invariants:
//! - Every rank issues the same collectives in the same order. The group is [`Send`] but not [`Sync`]: one thread
//!   drives it. Asynchronous operations ([`Work`]) are ordered by their start.
//! - Every operation ends within the group's timeout, with [`CollectiveError::Timeout`] or the backend's error
//!   (a peer that died closes its connections, which fails the operation before the timeout).
//! - After any failure the group refuses further work ([`CollectiveError::Failed`]): ranks may disagree on how far
//!   they got, so the caller builds a new group on a fresh store prefix.
//! - Tensors must be dense and contiguous; in-place operations write into the caller's storage (autograd is not
//!   involved: the shim works on detached views).

use std::cell::RefCell;
use std::ffi::CString;
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use crate::error::{CollectiveError, Result};
use crate::ffi::{self, RawGroup, RawWork, millis, take_error};
use crate::rendezvous;
use crate::store::Store;

/// Which network device Gloo binds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlooDevice {
    /// The address a host name or IP resolves to (`127.0.0.1` for tests on loopback).
    Hostname(String),
    /// A network interface by name (`eth0`; PyTorch's `GLOO_SOCKET_IFNAME`).
    Interface(String),
    /// This machine's host name, or loopback when it does not resolve (Gloo's default).
    Default,
}

impl GlooDevice {
    /// `GLOO_SOCKET_IFNAME` when set (as PyTorch reads it), else loopback when the store is on loopback, else this
    /// machine's address on the route to the master (what the master can reach us at: the machine's host name may
    /// resolve to an address on another network, or to none), else the machine's host name.
    pub fn for_master(master_addr: &str) -> GlooDevice {
        if let Ok(interface) = std::env::var("GLOO_SOCKET_IFNAME")
            && !interface.is_empty()
        {
            return GlooDevice::Interface(interface);
        }
        let loopback =
            master_addr == "localhost" || master_addr.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if loopback {
            return GlooDevice::Hostname("127.0.0.1".into());
        }
        match route_to(master_addr) {
            Some(ip) => GlooDevice::Hostname(ip.to_string()),
            None => GlooDevice::Default,
        }
    }
}

/// The local address the kernel would send from to reach `host` (a UDP "connect" sends nothing).
fn route_to(host: &str) -> Option<std::net::IpAddr> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let target = (host, 9).to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let socket = UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// How a group is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOptions {
    /// The longest any rendezvous or collective may take before it fails.
    pub timeout: Duration,
    /// Gloo's network device.
    pub device: GlooDevice,
    /// Gloo's worker threads (concurrent asynchronous operations); 0 keeps Gloo's default of 2.
    pub threads: usize,
    /// Also build an NCCL backend for CUDA tensors (needs the `nccl` feature, one GPU per rank).
    pub nccl: bool,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            timeout: Duration::from_secs(1800),
            device: GlooDevice::Hostname("127.0.0.1".into()),
            threads: 0,
            nccl: false,
        }
    }
}

/// How [`ProcessGroup::allreduce`] combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size (Gloo has no average; the division runs here, in the tensor's dtype).
    Avg,
    Max,
    Min,
}

/// A group of processes running collectives together.
#[derive(Debug)]
pub struct ProcessGroup {
    raw: NonNull<RawGroup>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    failed: RefCell<Option<String>>,
}

// SAFETY: the c10d backends may be driven from any thread as long as calls are not concurrent; `ProcessGroup` is
// not `Sync`, so one thread at a time uses it.
unsafe impl Send for ProcessGroup {}

/// An operation in flight. Its tensors are kept alive by the shim; read or write them only after [`Work::wait`].
#[derive(Debug)]
#[must_use = "a collective in flight must be waited on"]
pub struct Work<'g> {
    raw: NonNull<RawWork>,
    group: &'g ProcessGroup,
    op: &'static str,
    /// (host copy the backend works on, the caller's device tensor) for a device tensor staged through host
    /// memory: the result is copied back on success.
    staged: Option<(Tensor, Tensor)>,
}

impl Work<'_> {
    /// Waits for the operation, up to the group's timeout.
    pub fn wait(mut self) -> Result<()> {
        // SAFETY: `raw` is a live work handle owned by `self`.
        let result = take_error(unsafe { ffi::trinity_work_wait(self.raw.as_ptr(), millis(self.group.timeout)) });
        result.map_err(|m| self.group.failure(self.op, m))?;
        if let Some((host, mut device)) = self.staged.take() {
            tch::no_grad(|| device.f_copy_(&host))?;
        }
        Ok(())
    }

    /// Whether the operation finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        // SAFETY: `raw` is a live work handle owned by `self`.
        unsafe { ffi::trinity_work_is_completed(self.raw.as_ptr()) }
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from the shim and is freed once; c10d keeps the operation's own state alive until it
        // ends, so freeing an unfinished work does not free memory the backend still uses.
        unsafe { ffi::trinity_work_free(self.raw.as_ptr()) };
    }
}

fn check_tensor(op: &str, t: &Tensor) -> Result<()> {
    if !t.defined() {
        return Err(CollectiveError::InvalidArgument(format!("{op}: undefined tensor")));
    }
    if !t.is_contiguous() {
        return Err(CollectiveError::InvalidArgument(format!("{op}: the tensor must be contiguous")));
    }
    if t.is_sparse() {
        return Err(CollectiveError::InvalidArgument(format!("{op}: sparse tensors are not supported")));
    }
    Ok(())
}

impl ProcessGroup {
    /// Joins the group of `world_size` processes as `rank`, meeting on `store`, which must be a prefix no earlier
    /// group used (a group keeps its rendezvous keys). Fails when the ranks disagree on the world size, a rank is
    /// taken twice, or not everyone arrives within `options.timeout`.
    pub fn new(store: &Store, rank: usize, world_size: usize, options: &GroupOptions) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(CollectiveError::InvalidArgument(format!("rank {rank} is outside world size {world_size}")));
        }
        let world = i32::try_from(world_size)
            .map_err(|_| CollectiveError::InvalidArgument(format!("world size {world_size} is too large")))?;
        rendezvous::meet(store, rank, world_size, options.timeout)?;
        let (kind, name) = match &options.device {
            GlooDevice::Hostname(h) => (0, h.as_str()),
            GlooDevice::Interface(i) => (1, i.as_str()),
            GlooDevice::Default => (2, ""),
        };
        let c_name = CString::new(name)
            .map_err(|_| CollectiveError::InvalidArgument(format!("device name {name:?} contains a NUL byte")))?;
        let threads = i32::try_from(options.threads).unwrap_or(i32::MAX);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the store handle is live, `c_name` outlives the call, `raw` is written only on success. The
        // backends keep their own reference to the store.
        let result = unsafe {
            ffi::trinity_group_new(
                store.raw(),
                rank as i32,
                world,
                millis(options.timeout),
                kind,
                c_name.as_ptr(),
                threads,
                options.nccl,
                &mut raw,
            )
        };
        take_error(result).map_err(|m| CollectiveError::from_backend("process group", m, options.timeout))?;
        let raw = NonNull::new(raw).ok_or_else(|| CollectiveError::Backend {
            op: "process group",
            message: "the shim returned no group".into(),
        })?;
        Ok(ProcessGroup { raw, rank, world_size, timeout: options.timeout, failed: RefCell::new(None) })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The longest a collective waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether CUDA tensors go through NCCL.
    pub fn has_nccl(&self) -> bool {
        // SAFETY: `raw` is a live group handle.
        unsafe { ffi::trinity_group_has_nccl(self.raw.as_ptr()) }
    }

    /// The reason an earlier collective failed, if one did.
    pub fn failure_reason(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    fn failure(&self, op: &'static str, message: String) -> CollectiveError {
        let err = CollectiveError::from_backend(op, message, self.timeout);
        self.failed.borrow_mut().get_or_insert_with(|| err.to_string());
        err
    }

    fn usable(&self) -> Result<()> {
        match &*self.failed.borrow() {
            Some(reason) => Err(CollectiveError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    fn start(&self, op: &'static str, f: impl FnOnce(*mut *mut RawWork) -> ffi::Error) -> Result<Work<'_>> {
        self.usable()?;
        let mut raw = std::ptr::null_mut();
        take_error(f(&mut raw)).map_err(|m| self.failure(op, m))?;
        let raw = NonNull::new(raw).ok_or_else(|| self.failure(op, "the shim returned no work".into()))?;
        Ok(Work { raw, group: self, op, staged: None })
    }

    fn root(&self, root: usize) -> Result<i32> {
        if root >= self.world_size {
            return Err(CollectiveError::InvalidArgument(format!(
                "root rank {root} is outside world size {}",
                self.world_size
            )));
        }
        Ok(root as i32)
    }

    /// The tensor the backend works on: `tensor` itself, or for a device tensor without a backend for its device
    /// (CUDA without NCCL), a host copy to run through Gloo and copy back (`Some` second element).
    fn on_backend(&self, tensor: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        if tensor.device() == Device::Cpu || (tensor.device().is_cuda() && self.has_nccl()) {
            return Ok((tensor.shallow_clone(), None));
        }
        Ok((tensor.f_to_device(Device::Cpu)?.f_contiguous()?, Some(tensor.shallow_clone())))
    }

    /// Starts broadcasting `tensor` from `root` into the same-shaped tensor of every other rank.
    pub fn broadcast_async(&self, tensor: &Tensor, root: usize) -> Result<Work<'_>> {
        check_tensor("broadcast", tensor)?;
        let root = self.root(root)?;
        let timeout = millis(self.timeout);
        let (t, device) = self.on_backend(tensor)?;
        // SAFETY: the group and tensor are live; the shim copies the tensor handle (sharing storage) into the work.
        let mut work = self.start("broadcast", |out| unsafe {
            ffi::trinity_group_broadcast(self.raw.as_ptr(), t.as_ptr(), root, timeout, out)
        })?;
        work.staged = device.map(|d| (t, d));
        Ok(work)
    }

    /// Broadcasts `tensor` from `root`: on return every rank's `tensor` holds the root's values.
    pub fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        self.broadcast_async(tensor, root)?.wait()
    }

    /// Starts an in-place all-reduce of `tensor` with `op` (sum, max or min; see [`ProcessGroup::allreduce`] for
    /// the average).
    pub fn allreduce_async(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work<'_>> {
        check_tensor("allreduce", tensor)?;
        let code = match op {
            ReduceOp::Sum | ReduceOp::Avg => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        let timeout = millis(self.timeout);
        let (t, device) = self.on_backend(tensor)?;
        // SAFETY: the group and tensor are live; the shim copies the tensor handle (sharing storage) into the work.
        let mut work = self.start("allreduce", |out| unsafe {
            ffi::trinity_group_allreduce(self.raw.as_ptr(), t.as_ptr(), code, timeout, out)
        })?;
        work.staged = device.map(|d| (t, d));
        Ok(work)
    }

    /// Reduces `tensor` over all ranks in place: afterwards every rank holds the same result.
    pub fn allreduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        self.allreduce_async(tensor, op)?.wait()?;
        if op == ReduceOp::Avg {
            average_in_place(tensor, self.world_size)?;
        }
        Ok(())
    }

    /// Every rank's `tensor` (same shape and dtype on all ranks), in rank order.
    pub fn allgather(&self, tensor: &Tensor) -> Result<Vec<Tensor>> {
        check_tensor("allgather", tensor)?;
        let (input, device) = self.on_backend(tensor)?;
        let tensor = &input;
        let outputs: Vec<Tensor> =
            (0..self.world_size).map(|_| tensor.f_empty_like()).collect::<Result<_, tch::TchError>>()?;
        let ptrs: Vec<*const torch_sys::C_tensor> = outputs.iter().map(Tensor::as_ptr).collect();
        let timeout = millis(self.timeout);
        // SAFETY: the group, input and outputs are live; the shim copies their handles into the work.
        let work = self.start("allgather", |out| unsafe {
            ffi::trinity_group_allgather(self.raw.as_ptr(), tensor.as_ptr(), ptrs.as_ptr(), ptrs.len(), timeout, out)
        })?;
        work.wait()?;
        match device {
            Some(d) => Ok(outputs.iter().map(|o| o.f_to_device(d.device())).collect::<Result<_, _>>()?),
            None => Ok(outputs),
        }
    }

    /// Checks the operands of a flat collective: contiguous, one dtype and device, `big` holding `world_size`
    /// times `small`'s elements.
    fn check_flat(&self, op: &str, small: &Tensor, big: &Tensor) -> Result<()> {
        check_tensor(op, small)?;
        check_tensor(op, big)?;
        if small.kind() != big.kind() || small.device() != big.device() {
            return Err(CollectiveError::InvalidArgument(format!(
                "{op}: the tensors differ in dtype or device ({:?} on {:?}, {:?} on {:?})",
                small.kind(),
                small.device(),
                big.kind(),
                big.device()
            )));
        }
        if small.numel() * self.world_size != big.numel() {
            return Err(CollectiveError::InvalidArgument(format!(
                "{op}: {} elements are not {} ranks × {}",
                big.numel(),
                self.world_size,
                small.numel()
            )));
        }
        Ok(())
    }

    /// Starts a flat reduce-scatter (torch's `reduce_scatter_tensor`): `input` holds `world_size` equal chunks and
    /// this rank's `output` receives the reduction with `op` (sum, max or min) of every rank's chunk `rank`.
    pub fn reduce_scatter_flat_async(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<Work<'_>> {
        self.check_flat("reduce_scatter", output, input)?;
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
            ReduceOp::Avg => {
                return Err(CollectiveError::InvalidArgument(
                    "reduce_scatter: sum and divide, Gloo has no average".into(),
                ));
            }
        };
        let timeout = millis(self.timeout);
        let (input, _) = self.on_backend(input)?;
        let (t, device) = self.on_backend(output)?;
        // SAFETY: the group and tensors are live; the shim copies the tensor handles (sharing storage) into the work.
        let mut work = self.start("reduce_scatter", |out| unsafe {
            ffi::trinity_group_reduce_scatter_flat(self.raw.as_ptr(), t.as_ptr(), input.as_ptr(), code, timeout, out)
        })?;
        work.staged = device.map(|d| (t, d));
        Ok(work)
    }

    /// Starts a flat all-gather (torch's `all_gather_into_tensor`): `output` (`world_size` times `input`'s
    /// elements) receives every rank's `input` in rank order.
    pub fn allgather_flat_async(&self, input: &Tensor, output: &Tensor) -> Result<Work<'_>> {
        self.check_flat("allgather", input, output)?;
        let timeout = millis(self.timeout);
        let (input, _) = self.on_backend(input)?;
        let (t, device) = self.on_backend(output)?;
        // SAFETY: the group and tensors are live; the shim copies the tensor handles (sharing storage) into the work.
        let mut work = self.start("allgather", |out| unsafe {
            ffi::trinity_group_allgather_flat(self.raw.as_ptr(), t.as_ptr(), input.as_ptr(), timeout, out)
        })?;
        work.staged = device.map(|d| (t, d));
        Ok(work)
    }

    /// Returns when every rank reached the barrier.
    pub fn barrier(&self) -> Result<()> {
        let timeout = millis(self.timeout);
        // SAFETY: the group is live.
        self.start("barrier", |out| unsafe { ffi::trinity_group_barrier(self.raw.as_ptr(), timeout, out) })?.wait()
    }

    /// `bytes` of the root, on every rank (the other ranks' argument is ignored): a length, then the payload.
    pub fn broadcast_bytes(&self, bytes: &[u8], root: usize) -> Result<Vec<u8>> {
        let mut len = Tensor::from_slice(&[bytes.len() as i64]);
        self.broadcast(&mut len, root)?;
        let n = len.f_int64_value(&[0])?;
        let mut payload = if self.rank == root {
            Tensor::from_slice(bytes)
        } else {
            Tensor::f_zeros([n], (Kind::Uint8, Device::Cpu))?
        };
        if n > 0 {
            self.broadcast(&mut payload, root)?;
        }
        tensor_bytes(&payload)
    }

    /// Every rank's `bytes`, in rank order (lengths may differ).
    pub fn allgather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lengths = self.allgather(&Tensor::from_slice(&[bytes.len() as i64]))?;
        let lengths: Vec<i64> = lengths.iter().map(|l| l.f_int64_value(&[0])).collect::<Result<_, _>>()?;
        let longest = lengths.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Ok(vec![Vec::new(); self.world_size]);
        }
        let padded = Tensor::f_zeros([longest], (Kind::Uint8, Device::Cpu))?;
        padded.f_narrow(0, 0, bytes.len() as i64)?.f_copy_(&Tensor::from_slice(bytes))?;
        let gathered = self.allgather(&padded)?;
        gathered.iter().zip(&lengths).map(|(t, &n)| tensor_bytes(&t.f_narrow(0, 0, n)?)).collect()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: `raw` came from the shim and is freed once. Gloo's destructor drains its queue: an operation
        // still in flight ends within the group's timeout.
        unsafe { ffi::trinity_group_free(self.raw.as_ptr()) };
    }
}

/// Divides a summed tensor by the world size (integer tensors by truncation, as `torch.div(rounding_mode="trunc")`).
pub(crate) fn average_in_place(tensor: &mut Tensor, world_size: usize) -> Result<()> {
    let _guard = tch::no_grad_guard();
    if tensor.is_floating_point() {
        let _ = tensor.f_div_scalar_(world_size as f64)?;
    } else {
        let _ = tensor.f_floor_divide_scalar_(world_size as i64)?;
    }
    Ok(())
}

fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let n = t.numel();
    let mut out = vec![0u8; n];
    if n > 0 {
        t.f_to_kind(Kind::Uint8)?.f_contiguous()?.f_copy_data_u8(&mut out, n)?;
    }
    Ok(out)
}
