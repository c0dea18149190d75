//! The writer side of the event stream: NDJSON lines to stdout or `--json`, and to the
//! readers of the event socket.

use std::{io::Write, path::Path, time::SystemTime};

use serde::Serialize;

use super::{Event, SCHEMA_VERSION};
use crate::{
    events::output::{Notice, Output, Target},
    events::private_file::PrivateFileError,
    events::rotation::RotationLimits,
    events::stream::StreamServer,
};

#[derive(Serialize)]
struct Envelope<'a> {
    schema: u32,
    ts: String,
    #[serde(flatten)]
    event: &'a Event,
}

/// Writes events as NDJSON, and to the readers of the event socket when one is served.
/// Emitting never fails and never blocks: the output has a writer thread of its own (see
/// [`crate::events::output`]), and what happens to it comes back as warning events.
pub struct NdjsonSink {
    out: Output,
    socket: Option<StreamServer>,
    /// Events kept for an in-process consumer (the metrics endpoint) until it takes them.
    kept: Option<Kept>,
}

/// Events kept at most between two takes.
const MAX_KEPT: usize = 1 << 16;

struct Kept {
    wants: fn(&Event) -> bool,
    events: Vec<Event>,
}

impl NdjsonSink {
    pub fn stdout() -> Self {
        NdjsonSink::new(Output::start(Target::Stdout).expect("stdout needs no checks"))
    }

    pub fn to_writer(out: Box<dyn Write + Send>) -> Self {
        NdjsonSink::new(Output::start(Target::Writer(out)).expect("a writer needs no checks"))
    }

    /// Appends to `path`, created 0600, never through a symbolic link (see
    /// [`crate::events::private_file`]), rotated within `limits`.
    pub fn file(path: &Path, limits: RotationLimits) -> Result<Self, PrivateFileError> {
        Ok(NdjsonSink::new(Output::start(Target::File(
            path.to_path_buf(),
            limits,
        ))?))
    }

    fn new(out: Output) -> Self {
        NdjsonSink {
            out,
            socket: None,
            kept: None,
        }
    }

    /// From now on, also keep a copy of every event `wants` selects, until
    /// [`NdjsonSink::take_kept`].
    pub fn keep(&mut self, wants: fn(&Event) -> bool) {
        self.kept = Some(Kept {
            wants,
            events: vec![],
        });
    }

    /// The events kept since the last call, in order.
    pub fn take_kept(&mut self) -> Vec<Event> {
        self.kept
            .as_mut()
            .map(|k| std::mem::take(&mut k.events))
            .unwrap_or_default()
    }

    /// The event socket, for a stopping agent to drain.
    pub fn take_socket(&mut self) -> Option<StreamServer> {
        self.socket.take()
    }

    /// Also serve every event on the socket from now on.
    pub fn serve(&mut self, socket: StreamServer) {
        self.socket = Some(socket);
    }

    /// Writes one event. What happens to the output is reported at [`NdjsonSink::flush`],
    /// once per cycle, not looked up per event.
    pub fn emit(&mut self, event: &Event) {
        let env = Envelope {
            schema: SCHEMA_VERSION,
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event,
        };
        let line = match serde_json::to_string(&env) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "an event could not be serialized");
                return;
            }
        };
        if let Some(s) = &self.socket {
            s.publish(event.replay_role(), line.as_str().into());
        }
        if let Some(k) = self.kept.as_mut().filter(|k| (k.wants)(event)) {
            // Taken every cycle; bounded for cycles that keep failing before they are.
            if k.events.len() < MAX_KEPT {
                k.events.push(event.clone());
            }
        }
        self.out.send(line);
    }

    /// Says what happened to the output since last time: on stderr, and as an event (to
    /// the socket, and to the output itself, which takes it once it works again). Lost or
    /// unbounded events are errors (faults the agent survives); the rest are warnings.
    fn report_output(&mut self) {
        for n in self.out.notices() {
            let error = matches!(n, Notice::Failed { .. } | Notice::RotateFailed { .. });
            let (code, message) = match n {
                Notice::Failed { output, error } => (
                    "output_failed",
                    format!("cannot write events to {output} ({error}); the agent keeps controlling, and says when writing works again"),
                ),
                Notice::Stalled { output } => (
                    "output_stalled",
                    format!("{output} does not take events as fast as they come (a reader that stopped reading?); events are dropped until it does, the agent keeps controlling"),
                ),
                Notice::Recovered { output, dropped } => (
                    "output_recovered",
                    format!("writing events to {output} works again; {dropped} event(s) were lost meanwhile"),
                ),
                Notice::RotateFailed { output, error } => (
                    "rotate_failed",
                    format!("cannot rotate {output} ({error}); events stay in it, past --json-max-size, until rotating works again (tried at each write); the agent keeps controlling"),
                ),
                Notice::RotateRecovered { output } => (
                    "rotate_recovered",
                    format!("rotating {output} works again"),
                ),
            };
            if error {
                tracing::error!(code, "{message}");
                self.emit(&Event::error(code, message));
            } else {
                tracing::warn!(code, "{message}");
                self.emit(&Event::warning(code, message));
            }
        }
    }

    /// Lines dropped because the output did not keep up, since start.
    pub fn dropped(&self) -> u64 {
        self.out.dropped()
    }

    /// Reports output faults seen since the last flush; the agent calls it at the end of
    /// start-up and of every cycle.
    pub fn flush(&mut self) {
        self.report_output();
    }

    /// Opens the --json file again (SIGHUP, after logrotate moved it).
    pub fn reopen(&mut self) {
        self.out.reopen();
    }

    /// At stop: waits at most `timeout` for the output to take every event.
    pub fn drain(&mut self, timeout: std::time::Duration) -> bool {
        let ok = self.out.drain(timeout);
        self.report_output();
        ok
    }
}
