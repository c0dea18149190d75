//! Telling systemd (`Type=notify`, deploy/isolator.service) how the agent is doing: ready
//! once its programs are attached, alive once per cycle (the watchdog), stopping when it
//! puts its limits back. Without `NOTIFY_SOCKET` (not started by systemd) every call does
//! nothing. The protocol is the `sd-notify` crate's; this module only says when.

use std::time::Duration;

use sd_notify::NotifyState;

pub struct Notifier {
    /// `WATCHDOG_USEC`, when systemd expects a keep-alive within it (and it is meant for
    /// this process: `WATCHDOG_PID`).
    watchdog: Option<Duration>,
    enabled: bool,
    send_failed: bool,
}

impl Notifier {
    /// From the environment systemd gives the service.
    pub fn from_env() -> Notifier {
        Notifier {
            watchdog: sd_notify::watchdog_enabled(),
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some(),
            send_failed: false,
        }
    }

    /// Whether the agent was started by a service manager that wants to hear from it.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Why the watchdog could kill a healthy agent: it is pinged once a cycle, and systemd
    /// wants a ping within `WatchdogSec` (sd_watchdog_enabled(3) advises every half of it).
    pub fn watchdog_too_short(&self, interval: Duration) -> Option<String> {
        let limit = self.watchdog?;
        (limit < 2 * interval).then(|| {
            format!(
                "the systemd watchdog (WatchdogSec={}ms) is shorter than two cycles ({}ms at --interval {}ms): the agent pings once a cycle, so systemd may kill it while it is healthy; set WatchdogSec to at least {}s",
                limit.as_millis(),
                (2 * interval).as_millis(),
                interval.as_millis(),
                (2 * interval).as_secs_f64().ceil() as u64
            )
        })
    }

    /// The programs are attached and the first cycle is under way.
    pub fn ready(&mut self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// A cycle ended: the agent is alive (only with a watchdog).
    pub fn alive(&mut self) {
        if self.watchdog.is_some() {
            self.send(&[NotifyState::Watchdog]);
        }
    }

    /// The agent is stopping: it puts its limits back and detaches.
    pub fn stopping(&mut self) {
        self.send(&[
            NotifyState::Stopping,
            NotifyState::Status("stopping: putting limits back"),
        ]);
    }

    fn send(&mut self, states: &[NotifyState]) {
        if !self.enabled {
            return;
        }
        if let Err(e) = sd_notify::notify(states) {
            // Said once: systemd going away is not the agent's problem to repeat.
            if !std::mem::replace(&mut self.send_failed, true) {
                tracing::warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchdog_shorter_than_two_cycles_is_said() {
        let n = |usec: Option<u64>| Notifier {
            watchdog: usec.map(Duration::from_micros),
            enabled: true,
            send_failed: false,
        };
        let s = Duration::from_secs(1);
        assert_eq!(n(None).watchdog_too_short(s), None);
        assert_eq!(n(Some(30_000_000)).watchdog_too_short(10 * s), None);
        assert_eq!(n(Some(2_000_000)).watchdog_too_short(s), None);
        let e = n(Some(1_500_000)).watchdog_too_short(s).unwrap();
        assert!(
            e.contains("WatchdogSec=1500ms") && e.contains("at least 2s"),
            "{e}"
        );
    }
}
