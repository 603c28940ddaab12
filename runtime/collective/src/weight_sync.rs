//! Weights from the trainer to explorers in other processes (Trinity's `sync_method: nccl` when explorer and
//! trainer do not share a process): trainer rank 0 is the [`WeightSender`], every explorer a [`WeightReceiver`],
//! and they form one process group (the sender is rank 0): NCCL when the sender and every receiver hold their
//! weights on CUDA, else Gloo, with CUDA weights staged through host memory on the side that holds them
//! ([`crate::transport`]).
//!
//! Protocol, on a store the sender hosts (keys under `weight_sync/`):
//! - `receivers`: how many explorers the sender expects; `offered`: the newest version the sender wants to send
//!   (set before it waits for anyone, so an explorer can see a sync is due: [`WeightReceiver::offered_version`]).
//! - A group lives for one *generation* `g` (`generation` counter). Receivers join it with a ticket
//!   (`gen<g>/tickets`, ranks 1..=n) and say where their weights live (`gen<g>/placement/<rank>`: `cpu` or
//!   `cuda`); the sender decides the transport from those and its own (`gen<g>/transport`) before anyone builds
//!   the group, so every rank builds the same backends. The sender writes the [`Layout`] (names, dtypes, shapes,
//!   bucket size) to `gen<g>/layout` once, so a sync sends only bytes.
//! - Sync number `s` of a generation: the sender announces the version (`gen<g>/sync/<s>`), broadcasts the byte
//!   stream bucket by bucket, and waits until every receiver counted itself in `gen<g>/ack/<s>` after applying
//!   it: the version handshake. Then it sets `latest`.
//! - Buckets are double-buffered: the sender packs bucket k+1 while bucket k is on the wire; a receiver posts the
//!   receive of bucket k+1 before it unpacks bucket k.
//! - Any failure (a peer died, a timeout) marks `gen<g>/failed`; the sender then moves on to generation g+1 and
//!   builds a new group at its next [`WeightSender::publish`], which receivers join at their next
//!   [`WeightReceiver::receive`]. A receiver that finds its generation failed or full waits for the next one. Every
//!   wait ends within the timeout, so a caller can fall back to checkpoint sync.

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use crate::error::{CollectiveError, Result};
use crate::group::{GlooDevice, GroupOptions, ProcessGroup, Work};
use crate::store::Store;
use crate::transport::{self, Placement, Transport};
use crate::weight_layout::{Layout, pack, unpack};

/// What [`transport::check_build`] names when a process with CUDA weights lacks NCCL.
const WHAT: &str = "weight sync (synchronizer.sync_method: nccl)";

/// How a transfer runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSyncOptions {
    /// The longest any step (joining, a sync, the acknowledgements) may take: Trinity's `sync_timeout`.
    pub timeout: Duration,
    /// Bytes per bucket (two are allocated on each side). The sender's value is the one used.
    pub bucket_bytes: usize,
    /// Gloo's network device.
    pub device: GlooDevice,
    /// Send floating-point tensors in this dtype (the rollout model's, e.g. bf16 from an fp32 trainer), converted
    /// while packing each bucket instead of in a separate pass; `None` sends them as they are. Sender only.
    pub dtype: Option<Kind>,
    /// Where this side's weights live (the trainer's, or the explorer engine's): with CUDA on every side the
    /// buckets stay on the GPUs and go over NCCL.
    pub tensors: Device,
}

impl Default for WeightSyncOptions {
    fn default() -> Self {
        WeightSyncOptions {
            timeout: Duration::from_secs(3600),
            bucket_bytes: 256 << 20,
            device: GlooDevice::Hostname("127.0.0.1".into()),
            dtype: None,
            tensors: Device::Cpu,
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyncReport {
    pub version: u64,
    /// Bytes sent or received (the stream, alignment included).
    pub bytes: usize,
    pub buckets: usize,
    /// From the announcement (or its discovery) to the last acknowledgement or applied tensor.
    pub seconds: f64,
}

const POLL: Duration = Duration::from_millis(5);

fn group_options(options: &WeightSyncOptions) -> GroupOptions {
    GroupOptions { timeout: options.timeout, device: options.device.clone(), ..GroupOptions::default() }
}

fn parse_u64(store: &Store, key: &str) -> Result<u64> {
    let bytes = store.get(key)?;
    String::from_utf8_lossy(&bytes)
        .parse()
        .map_err(|_| CollectiveError::WeightSync(format!("store key {key:?} holds {bytes:?}, not a number")))
}

/// The two bucket buffers of a layout, allocated once per sender or joined receiver: a fresh pair per sync would
/// page-fault hundreds of MiB each time.
fn bucket_buffers(layout: &Layout, device: Device) -> Result<[Tensor; 2]> {
    let len = layout.bucket_bytes.min(layout.total.max(1)) as i64;
    Ok([Tensor::f_empty([len], (Kind::Uint8, device))?, Tensor::f_empty([len], (Kind::Uint8, device))?])
}

/// Says once per process that its CUDA weights go through host memory, because a peer holds its weights on the
/// CPU (a defined, slower path, not an error). Nothing to say for a side on the CPU.
fn note_staged(own: Device) {
    static NOTED: std::sync::Once = std::sync::Once::new();
    if !own.is_cuda() {
        return;
    }
    NOTED.call_once(|| {
        tracing::info!(
            "weight sync: this side's weights are on {own:?} and a peer's are on the CPU, so the buckets go over \
             Gloo through host memory (NCCL needs CUDA tensors on every side)"
        );
    });
}

/// Waits until every CUDA operation on the weights' device finished, so that an acknowledgement means applied.
fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// The trainer's side: hosts the store and sends each new version to every receiver.
#[derive(Debug)]
pub struct WeightSender {
    store: Store,
    receivers: usize,
    options: WeightSyncOptions,
    generation: u64,
    group: Option<ProcessGroup>,
    /// The current generation's transport (set with `group`).
    transport: Transport,
    layout: Option<Layout>,
    /// The bucket buffers and the device they are on (the transport may differ between generations).
    buffers: Option<(Device, [Tensor; 2])>,
    seq: u64,
}

impl WeightSender {
    /// Hosts the rendezvous store on `host:port` (port 0 picks one: [`WeightSender::port`]) for `receivers`
    /// explorers.
    pub fn host(host: &str, port: u16, receivers: usize, options: WeightSyncOptions) -> Result<Self> {
        if receivers == 0 {
            return Err(CollectiveError::InvalidArgument("a weight sender needs at least one receiver".into()));
        }
        transport::check_build(options.tensors, WHAT)?;
        let store = Store::server(host, port, options.timeout)?.with_prefix("weight_sync")?;
        store.set("receivers", receivers.to_string().as_bytes())?;
        let generation = u64::try_from(store.add("generation", 0)?).unwrap_or(0);
        Ok(WeightSender {
            store,
            receivers,
            options,
            generation,
            group: None,
            transport: Transport::Gloo,
            layout: None,
            buffers: None,
            seq: 0,
        })
    }

    /// The store's port, for the explorers' configuration.
    pub fn port(&self) -> u16 {
        self.store.port()
    }

    /// The current group generation (it advances after every failure).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Sends `weights` as `version` to every receiver and returns when all of them applied it (floating-point
    /// tensors in [`WeightSyncOptions::dtype`] when set). The names, dtypes and shapes must be the same at every
    /// call. On failure the group is dropped and the next call builds a new
    /// one (waiting up to the timeout for the receivers to join it).
    pub fn publish(&mut self, version: u64, weights: &[(String, Tensor)]) -> Result<SyncReport> {
        let shapes = weights.iter().map(|(name, t)| (name.as_str(), t.kind(), t.size()));
        let (pushed, report) = self.publish_parts(version, shapes, |sink| {
            sink.push(weights.iter().map(|(name, t)| (name.clone(), t.shallow_clone())).collect())
        })?;
        pushed.map(|()| report)
    }

    /// [`WeightSender::publish`] for a sender that never holds every tensor at once: `tensors` names them (with
    /// dtypes and shapes, in order) before any exists, and `feed` hands them to the [`PartSink`] part by part,
    /// in that order. Each bucket goes out as soon as the parts before its end arrived, and a part is dropped
    /// once its last bucket is packed, so the transfer holds the sink's two buckets and the parts of the
    /// buckets being filled. Returns what `feed` returned with the report; fails when `feed` stopped short.
    /// A `feed` that stops short leaves the receivers waiting for the rest of the stream until the timeout.
    pub fn publish_parts<'a, T>(
        &mut self,
        version: u64,
        tensors: impl IntoIterator<Item = (&'a str, Kind, Vec<i64>)>,
        feed: impl FnOnce(&mut PartSink<'_>) -> T,
    ) -> Result<(T, SyncReport)> {
        let layout = Layout::of_shapes(tensors, self.options.bucket_bytes, self.options.dtype)?;
        match &self.layout {
            Some(known) if known.entries != layout.entries => {
                return Err(CollectiveError::WeightSync(
                    "the tensors differ from the first publish (names, dtypes or shapes)".into(),
                ));
            }
            Some(_) => {}
            None => self.layout = Some(layout),
        }
        self.store.set("offered", version.to_string().as_bytes())?;
        let result = self.try_publish(version, feed);
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    fn try_publish<T>(&mut self, version: u64, feed: impl FnOnce(&mut PartSink<'_>) -> T) -> Result<(T, SyncReport)> {
        let g = self.generation;
        if self.group.is_some() && self.store.check(&[&format!("gen{g}/failed")])? {
            return Err(CollectiveError::WeightSync(format!("a receiver reported generation {g} failed")));
        }
        let layout = self.layout.clone().ok_or_else(|| CollectiveError::WeightSync("no layout".into()))?;
        if self.group.is_none() {
            self.store.set(&format!("gen{g}/layout"), layout.encode()?.as_bytes())?;
            let transport = self.choose_transport(g)?;
            let prefix = self.store.with_prefix(&format!("gen{g}/group"))?;
            let options = GroupOptions { nccl: transport.needs_nccl(), ..group_options(&self.options) };
            self.group = Some(ProcessGroup::new(&prefix, 0, self.receivers + 1, &options)?);
            self.transport = transport;
            self.seq = 0;
            tracing::info!(
                "weight sync: generation {g} formed with {} receivers over {}",
                self.receivers,
                transport.name()
            );
        }
        let start = Instant::now();
        let s = self.seq;
        self.store.set(&format!("gen{g}/sync/{s}"), version.to_string().as_bytes())?;
        let on = self.transport.buffer_device(self.options.tensors);
        if self.buffers.as_ref().map(|(device, _)| *device) != Some(on) {
            self.buffers = None;
            self.buffers = Some((on, bucket_buffers(&layout, on)?));
        }
        let group = self.group.as_ref().ok_or_else(|| CollectiveError::WeightSync("no group".into()))?;
        let (_, buffers) = self.buffers.as_ref().ok_or_else(|| CollectiveError::WeightSync("no buffers".into()))?;
        let mut sink = PartSink::new(group, &layout, buffers);
        let fed = feed(&mut sink);
        sink.finish()?;
        let deadline = start + self.options.timeout;
        let ack = format!("gen{g}/ack/{s}");
        while self.store.add(&ack, 0)? < self.receivers as i64 {
            if Instant::now() >= deadline {
                return Err(CollectiveError::Timeout {
                    op: "weight sync acknowledgements",
                    timeout: self.options.timeout,
                    detail: Some(format!(
                        "version {version}: {} of {} receivers applied it",
                        self.store.add(&ack, 0)?,
                        self.receivers
                    )),
                });
            }
            std::thread::sleep(POLL);
        }
        self.store.set("latest", version.to_string().as_bytes())?;
        self.seq += 1;
        let report = SyncReport {
            version,
            bytes: layout.total,
            buckets: layout.buckets(),
            seconds: start.elapsed().as_secs_f64(),
        };
        Ok((fed, report))
    }

    /// Waits (up to the timeout) until every receiver of generation `g` said where its weights live, then decides
    /// the generation's transport and posts it for them.
    fn choose_transport(&self, g: u64) -> Result<Transport> {
        let deadline = Instant::now() + self.options.timeout;
        let key = |rank: usize| format!("gen{g}/placement/{rank}");
        let mut placements = Vec::with_capacity(self.receivers);
        for rank in 1..=self.receivers {
            while !self.store.check(&[&key(rank)])? {
                if Instant::now() >= deadline {
                    return Err(CollectiveError::Timeout {
                        op: "weight sync join",
                        timeout: self.options.timeout,
                        detail: Some(format!("{} of {} receivers joined generation {g}", rank - 1, self.receivers)),
                    });
                }
                std::thread::sleep(POLL);
            }
            placements.push(Placement::parse(&String::from_utf8_lossy(&self.store.get(&key(rank))?))?);
        }
        let transport = transport::for_weight_sync(Placement::of(self.options.tensors), &placements);
        if transport == Transport::GlooStaged {
            note_staged(self.options.tensors);
        }
        self.store.set(&format!("gen{g}/transport"), transport.name().as_bytes())?;
        Ok(transport)
    }

    /// Marks the generation failed and moves on to the next one.
    fn fail(&mut self, error: &CollectiveError) {
        let g = self.generation;
        tracing::warn!("weight sync: generation {g} failed ({error}); the next publish builds a new group");
        let _ = self.store.set(&format!("gen{g}/failed"), error.to_string().as_bytes());
        if let Ok(next) = self.store.add("generation", 1) {
            self.generation = u64::try_from(next).unwrap_or(g + 1);
        } else {
            self.generation = g + 1;
        }
        self.group = None;
        self.seq = 0;
    }
}

/// The sender's end of one [`WeightSender::publish_parts`]: it takes the version's tensors part by part and
/// broadcasts the byte stream from rank 0 bucket by bucket as the parts fill them, packing bucket k+1 while
/// bucket k is on the wire.
pub struct PartSink<'a> {
    group: &'a ProcessGroup,
    layout: &'a Layout,
    buffers: &'a [Tensor; 2],
    /// The given tensors still needed by a bucket not packed yet, by layout entry.
    tensors: Vec<Option<Tensor>>,
    /// Entries given so far.
    given: usize,
    /// Entries before this one were dropped (their last bucket is packed).
    dropped: usize,
    next_bucket: usize,
    in_flight: Option<Work<'a>>,
    /// The first failure; later parts are refused with it.
    failed: Option<String>,
}

impl std::fmt::Debug for PartSink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartSink").field("given", &self.given).field("next_bucket", &self.next_bucket).finish()
    }
}

impl<'a> PartSink<'a> {
    fn new(group: &'a ProcessGroup, layout: &'a Layout, buffers: &'a [Tensor; 2]) -> PartSink<'a> {
        let tensors = (0..layout.entries.len()).map(|_| None).collect();
        PartSink {
            group,
            layout,
            buffers,
            tensors,
            given: 0,
            dropped: 0,
            next_bucket: 0,
            in_flight: None,
            failed: None,
        }
    }

    /// Takes the next tensors of the layout (names and shapes must match it, in order; any dtype or device) and
    /// sends every bucket they complete. After an error every later part is refused.
    pub fn push(&mut self, part: Vec<(String, Tensor)>) -> Result<()> {
        if let Some(first) = &self.failed {
            return Err(CollectiveError::WeightSync(format!("an earlier part of this sync failed: {first}")));
        }
        let result = self.take(part);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn take(&mut self, part: Vec<(String, Tensor)>) -> Result<()> {
        let entries = &self.layout.entries;
        for (name, t) in part {
            let Some(e) = entries.get(self.given) else {
                return Err(CollectiveError::WeightSync(format!(
                    "tensor `{name}` is past the {} the layout holds",
                    entries.len()
                )));
            };
            if e.name != name || e.shape != t.size() {
                return Err(CollectiveError::WeightSync(format!(
                    "tensor {} of the layout is `{}` {:?}, not `{name}` {:?}",
                    self.given,
                    e.name,
                    e.shape,
                    t.size()
                )));
            }
            self.tensors[self.given] = Some(t);
            self.given += 1;
        }
        // Every byte before the next tensor not given yet is known (padding included).
        let known = entries.get(self.given).map_or(self.layout.total, |e| e.offset);
        while self.next_bucket < self.layout.buckets() && self.layout.bucket_range(self.next_bucket).end <= known {
            self.send(self.next_bucket)?;
            self.next_bucket += 1;
        }
        let packed_through = self.next_bucket * self.layout.bucket_bytes;
        while self.dropped < self.given && entries[self.dropped].offset + entries[self.dropped].bytes <= packed_through
        {
            self.tensors[self.dropped] = None;
            self.dropped += 1;
        }
        Ok(())
    }

    /// How many of the given tensors the sink still holds (those a bucket not packed yet needs).
    pub fn held(&self) -> usize {
        self.tensors.iter().filter(|t| t.is_some()).count()
    }

    /// Packs bucket `k` into its buffer and starts its broadcast, after waiting for bucket k-1's (bucket k-2's,
    /// which used this buffer, ended when k-1 started).
    fn send(&mut self, k: usize) -> Result<()> {
        let len = self.layout.bucket_range(k).len() as i64;
        let buffer = &self.buffers[k % 2];
        pack(self.layout, k, &self.tensors, buffer)?;
        let work = self.group.broadcast_async(&buffer.f_narrow(0, 0, len)?, 0)?;
        if let Some(previous) = self.in_flight.replace(work) {
            previous.wait()?;
        }
        Ok(())
    }

    /// Ends the stream: every tensor must have been given and every bucket sent; waits for the last bucket.
    fn finish(mut self) -> Result<()> {
        if let Some(first) = self.failed.take() {
            return Err(CollectiveError::WeightSync(first));
        }
        if self.given != self.layout.entries.len() {
            return Err(CollectiveError::WeightSync(format!(
                "the sync was given {} of its {} tensors (the next is `{}`)",
                self.given,
                self.layout.entries.len(),
                self.layout.entries[self.given].name
            )));
        }
        match self.in_flight.take() {
            Some(last) => last.wait(),
            None => Ok(()),
        }
    }
}

/// An explorer's side: joins the sender's group and receives each version it sends.
#[derive(Debug)]
pub struct WeightReceiver {
    store: Store,
    options: WeightSyncOptions,
    receivers: usize,
    joined: Option<Joined>,
    last_version: Option<u64>,
}

#[derive(Debug)]
struct Joined {
    generation: u64,
    transport: Transport,
    group: ProcessGroup,
    layout: Layout,
    buffers: [Tensor; 2],
    seq: u64,
}

impl WeightReceiver {
    /// Connects to the sender's store (retrying until the timeout while it is not up yet).
    pub fn connect(host: &str, port: u16, options: WeightSyncOptions) -> Result<Self> {
        transport::check_build(options.tensors, WHAT)?;
        let store = Store::client(host, port, options.timeout)?.with_prefix("weight_sync")?;
        let receivers = parse_u64(&store, "receivers")? as usize;
        Ok(WeightReceiver { store, options, receivers, joined: None, last_version: None })
    }

    /// The newest version the sender has offered (it may still be waiting for receivers), without blocking.
    pub fn offered_version(&self) -> Result<Option<u64>> {
        if !self.store.check(&["offered"])? {
            return Ok(None);
        }
        parse_u64(&self.store, "offered").map(Some)
    }

    /// The version this receiver applied last.
    pub fn last_version(&self) -> Option<u64> {
        self.last_version
    }

    /// Waits for the next version and returns it with freshly allocated tensors (the sender's dtypes), on this
    /// side's CUDA device when the transport is NCCL, else on the CPU.
    pub fn receive(&mut self) -> Result<(u64, Vec<(String, Tensor)>)> {
        let mut out = Vec::new();
        let report = self.receive_with(|name, t| {
            let mut owned = t.f_empty_like()?;
            owned.f_copy_(t)?;
            out.push((name.to_owned(), owned));
            Ok(())
        })?;
        Ok((report.version, out))
    }

    /// Waits for the next version and hands each tensor to `apply` as soon as its bytes are in (a view valid only
    /// during the call: copy it into the model's own tensor). The sender learns the version was applied only after
    /// every `apply` returned.
    pub fn receive_with(&mut self, mut apply: impl FnMut(&str, &Tensor) -> Result<()>) -> Result<SyncReport> {
        let result = self.try_receive(&mut apply);
        if let Err(e) = &result
            && let Some(joined) = self.joined.take()
        {
            let _ = self.store.set(&format!("gen{}/failed", joined.generation), e.to_string().as_bytes());
        }
        result
    }

    fn try_receive(&mut self, apply: &mut dyn FnMut(&str, &Tensor) -> Result<()>) -> Result<SyncReport> {
        let deadline = Instant::now() + self.options.timeout;
        if self.joined.is_none() {
            self.joined = Some(self.join(deadline)?);
        }
        let joined = self.joined.as_mut().ok_or_else(|| CollectiveError::WeightSync("not joined".into()))?;
        let g = joined.generation;
        let announce = format!("gen{g}/sync/{}", joined.seq);
        let failed = format!("gen{g}/failed");
        while !self.store.check(&[&announce])? {
            if self.store.check(&[&failed])? {
                return Err(CollectiveError::WeightSync(format!("the sender abandoned generation {g}")));
            }
            if Instant::now() >= deadline {
                return Err(CollectiveError::Timeout {
                    op: "weight sync",
                    timeout: self.options.timeout,
                    detail: Some("no new version was announced".into()),
                });
            }
            std::thread::sleep(POLL);
        }
        let start = Instant::now();
        let version = parse_u64(&self.store, &announce)?;
        receive_buckets(&joined.group, &joined.layout, &joined.buffers, apply)?;
        if joined.transport == Transport::Nccl {
            synchronize(self.options.tensors);
        }
        self.store.add(&format!("gen{g}/ack/{}", joined.seq), 1)?;
        joined.seq += 1;
        self.last_version = Some(version);
        let layout = &joined.layout;
        Ok(SyncReport {
            version,
            bytes: layout.total,
            buckets: layout.buckets(),
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Joins the current generation, waiting for the next one while the current one failed or is full.
    fn join(&self, deadline: Instant) -> Result<Joined> {
        loop {
            let g = u64::try_from(self.store.add("generation", 0)?).unwrap_or(0);
            let usable = !self.store.check(&[&format!("gen{g}/failed")])?;
            if usable {
                let ticket = self.store.add(&format!("gen{g}/tickets"), 1)?;
                if ticket as usize <= self.receivers {
                    let placement = Placement::of(self.options.tensors);
                    self.store.set(&format!("gen{g}/placement/{ticket}"), placement.name().as_bytes())?;
                    if let Some(transport) = self.wait_for_transport(g, deadline)? {
                        let prefix = self.store.with_prefix(&format!("gen{g}/group"))?;
                        let mut options = group_options(&self.options);
                        options.timeout =
                            deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                        options.nccl = transport.needs_nccl();
                        let group = ProcessGroup::new(&prefix, ticket as usize, self.receivers + 1, &options)?;
                        let layout =
                            Layout::decode(&String::from_utf8_lossy(&self.store.get(&format!("gen{g}/layout"))?))?;
                        tracing::info!("weight sync: joined generation {g} as rank {ticket} over {}", transport.name());
                        if transport == Transport::GlooStaged {
                            note_staged(self.options.tensors);
                        }
                        let buffers = bucket_buffers(&layout, transport.buffer_device(self.options.tensors))?;
                        return Ok(Joined { generation: g, transport, group, layout, buffers, seq: 0 });
                    }
                }
            }
            // Failed or full: the sender will open the next generation.
            self.poll_until(
                deadline,
                || format!("generation {g} is failed or full and no new one was opened"),
                || Ok((u64::try_from(self.store.add("generation", 0)?).unwrap_or(0) != g).then_some(())),
            )?;
        }
    }
}

impl WeightReceiver {
    /// The transport the sender chose for generation `g`; `None` when it abandoned the generation first.
    fn wait_for_transport(&self, g: u64, deadline: Instant) -> Result<Option<Transport>> {
        let (key, failed) = (format!("gen{g}/transport"), format!("gen{g}/failed"));
        self.poll_until(
            deadline,
            || format!("the sender did not choose a transport for generation {g}"),
            || {
                if self.store.check(&[&key])? {
                    return Transport::parse(&String::from_utf8_lossy(&self.store.get(&key)?)).map(|t| Some(Some(t)));
                }
                Ok(self.store.check(&[&failed])?.then_some(None))
            },
        )
    }

    /// Polls the store every [`POLL`] until `ready` gives a value, or fails with a join timeout that says what
    /// was being waited for once `deadline` passes.
    fn poll_until<T>(
        &self,
        deadline: Instant,
        waiting_for: impl Fn() -> String,
        mut ready: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        loop {
            if let Some(value) = ready()? {
                return Ok(value);
            }
            if Instant::now() >= deadline {
                return Err(CollectiveError::Timeout {
                    op: "weight sync join",
                    timeout: self.options.timeout,
                    detail: Some(waiting_for()),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Receives the byte stream from rank 0 into two alternating buffers, unpacking bucket k while bucket k+1 arrives.
fn receive_buckets(
    group: &ProcessGroup,
    layout: &Layout,
    buffers: &[Tensor; 2],
    apply: &mut dyn FnMut(&str, &Tensor) -> Result<()>,
) -> Result<()> {
    let n = layout.buckets();
    if n == 0 {
        return Ok(());
    }
    let slice = |k: usize| buffers[k % 2].f_narrow(0, 0, layout.bucket_range(k).len() as i64);
    let mut partial = None;
    let mut next = Some(group.broadcast_async(&slice(0)?, 0)?);
    for k in 0..n {
        let current = next.take().ok_or_else(|| CollectiveError::WeightSync("bucket lost".into()))?;
        current.wait()?;
        if k + 1 < n {
            next = Some(group.broadcast_async(&slice(k + 1)?, 0)?);
        }
        unpack(layout, k, &slice(k)?, &mut partial, apply)?;
    }
    Ok(())
}
