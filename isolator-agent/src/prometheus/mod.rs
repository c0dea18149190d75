//! `isolator run --metrics ADDR`: a Prometheus endpoint (docs/metrics.md).
//!
//! The agent feeds it once per cycle with what the cycle already produced (`model`): the
//! collector's deltas and the events the cycle emitted. At the end of the cycle the model
//! is rendered once, in both formats, into an immutable buffer (`render`) that the HTTP
//! server (`server`), on a thread of its own, hands to every scrape: a scrape never touches
//! the agent's state nor delays a cycle, and a flood of scrapes costs socket writes only.

pub mod histogram;
pub mod model;
pub mod render;
pub mod server;

use std::{sync::Arc, time::Instant};

use crate::{
    events::Event,
    prometheus::{
        model::{CycleInput, Model},
        server::{Exposition, Limits, MetricsAddr, MetricsListener, MetricsServer, Published},
    },
};

/// What the endpoint needs from the agent's options.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `--metrics-max-series`.
    pub max_series: usize,
    /// The agent asks Docker (a `docker` discovery source is exported).
    pub docker: bool,
    /// The agent asks containerd (a `containerd` discovery source is exported).
    pub containerd: bool,
    pub limits: Limits,
}

/// The endpoint: the model, the exposition it last rendered, and the server.
pub struct Exporter {
    /// Shared with the renderer's registry during a render only (see `render::View`).
    model: Arc<Model>,
    published: Arc<Published>,
    address: MetricsAddr,
    scratch: String,
    // Declared last: stopped after the rest is dropped.
    _server: MetricsServer,
}

/// The events the exporter is fed (the sink keeps them between cycles); `cgroup_stats` is
/// handed over by the agent itself, and `policy_input` and the rest are not needed.
pub fn wants(e: &Event) -> bool {
    matches!(
        e,
        Event::AgentStart(_)
            | Event::CgroupGone(_)
            | Event::CycleEnd(_)
            | Event::ServiceStats(_)
            | Event::Decision(_)
            | Event::ViolationStart(_)
            | Event::DiskStall(_)
            | Event::Warning(_)
            | Event::Error(_)
            | Event::DockerConnected(_)
            | Event::ContainerdConnected(_)
    )
}

impl Exporter {
    /// Serves the listener (bound at start) from now on; until the first cycle, the
    /// exposition holds the agent's own series.
    pub fn start(listener: MetricsListener, settings: Settings) -> std::io::Result<Exporter> {
        let address = listener.address().clone();
        let published = Arc::new(Published::default());
        let server = MetricsServer::spawn(listener, published.clone(), settings.limits)?;
        let mut e = Exporter {
            model: Arc::new(Model::new(
                env!("CARGO_PKG_VERSION"),
                settings.max_series,
                settings.docker,
                settings.containerd,
            )),
            published,
            address,
            scratch: String::new(),
            _server: server,
        };
        e.render(Instant::now());
        Ok(e)
    }

    /// The address served, as bound.
    pub fn address(&self) -> &MetricsAddr {
        &self.address
    }

    /// Adds one cycle and publishes the new exposition.
    pub fn cycle(&mut self, input: &CycleInput) {
        let started = Instant::now();
        self.model_mut().apply(input);
        self.render(started);
    }

    fn model_mut(&mut self) -> &mut Model {
        Arc::get_mut(&mut self.model).expect("the model is shared only while rendering")
    }

    /// Renders and publishes; the time since `started` is said in the next exposition.
    fn render(&mut self, started: Instant) {
        let (exposition, series) = render::render(&self.model, &mut self.scratch);
        self.published.set(exposition);
        let x = &mut self.model_mut().exposition;
        x.last_series = series;
        x.last_export_s = started.elapsed().as_secs_f64();
    }

    /// The exposition scrapes get now.
    pub fn exposition(&self) -> Arc<Exposition> {
        self.published.get()
    }
}
