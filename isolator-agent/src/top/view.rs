//! Drawing: the header, the services table, the detail pane, the action log and help.
//! Reads the [`App`]; changes nothing.

use ratatui::{
    layout::{Alignment, Constraint, Layout, Rect},
    style::{Color, Modifier, Style, Stylize},
    text::{Line, Span},
    widgets::{
        Block, Borders, Cell, Clear, Paragraph, Row as TableRow, Sparkline, Table, TableState,
    },
    Frame,
};

use crate::config::{LatencyQuantile, SloClass};

use super::{
    app::{App, Pane},
    model::{latency_words, ns, Action, ActionKind, Column, Link, Row, RowKey, State},
    replay::Replay,
};

/// Smallest terminal the view draws into; below it says so instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 12;
/// Disk lines in the header at most.
const HEADER_DISKS: usize = 3;

/// Each column's width and its rank when the terminal is narrow (lower shows first).
fn column_width(c: Column) -> u16 {
    match c {
        Column::Name => 12,
        Column::Kind => 9,
        Column::Class => 11,
        // "p95 20.0ms": a target at another quantile names it.
        Column::Slo => 10,
        Column::P50 => 7,
        Column::P999 => 7,
        Column::Samples => 5,
        Column::Read => 7,
        Column::Write => 7,
        Column::Iops => 7,
        Column::Inflight => 5,
        Column::Limit => 9,
        Column::State => 9,
        Column::Vio => 6,
    }
}

const PRIORITY: [Column; 14] = [
    Column::Name,
    Column::State,
    Column::P999,
    Column::Samples,
    Column::Slo,
    Column::Read,
    Column::Write,
    Column::Limit,
    Column::Vio,
    Column::Iops,
    Column::P50,
    Column::Inflight,
    Column::Class,
    Column::Kind,
];

/// The columns that fit `width`, in display order, with their widths; the name column
/// takes what is left.
pub fn columns_for(width: u16) -> Vec<(Column, u16)> {
    let mut chosen: Vec<Column> = vec![];
    let mut used: u16 = 0;
    for c in PRIORITY {
        let w = column_width(c) + u16::from(!chosen.is_empty());
        if used + w <= width {
            used += w;
            chosen.push(c);
        }
    }
    Column::ALL
        .iter()
        .filter(|c| chosen.contains(c))
        .map(|&c| {
            let w = if c == Column::Name {
                column_width(c) + (width - used)
            } else {
                column_width(c)
            };
            (c, w)
        })
        .collect()
}

pub fn render(f: &mut Frame, app: &App) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "terminal too small ({}x{}): isolator top needs at least {MIN_WIDTH}x{MIN_HEIGHT}; enlarge it or press q",
            area.width, area.height
        );
        f.render_widget(
            Paragraph::new(msg)
                .wrap(ratatui::widgets::Wrap { trim: true })
                .alignment(Alignment::Center),
            area,
        );
        return;
    }
    let model = app.model();
    let disk_lines = model.disks.len().clamp(1, HEADER_DISKS) as u16;
    let [header, body, status] = Layout::vertical([
        Constraint::Length(1 + disk_lines),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(f, app, header);
    match app.pane {
        Pane::Table => render_table(f, app, body),
        Pane::Detail => {
            // The table as tall as its rows, up to half the body; the rest for detail.
            let table_h = (app.rows().len() as u16 + 2).clamp(5, (body.height / 2).max(5));
            let [t, d] =
                Layout::vertical([Constraint::Length(table_h), Constraint::Min(1)]).areas(body);
            render_table(f, app, t);
            render_detail(f, app, d);
        }
        Pane::Actions => render_actions(f, app, body),
    }
    render_status(f, app, status);
    if app.help {
        render_help(f, app, area);
    }
}

fn render_header(f: &mut Frame, app: &App, area: Rect) {
    let model = app.model();
    let mut lines = vec![];
    let mut first = vec![Span::styled("isolator top", Style::new().bold())];
    if app.replay.is_some() {
        first.push(Span::styled(" REPLAY", Style::new().fg(Color::Cyan).bold()));
    } else if app.paused() {
        first.push(Span::styled(
            " PAUSED",
            Style::new().fg(Color::Yellow).bold(),
        ));
    }
    match &model.header {
        Some(h) => {
            let policy = match &h.policy {
                Some(p) if h.dry_run => format!("{p} (dry run)"),
                Some(p) => p.clone(),
                None => "observe only".into(),
            };
            // The kernel last: a long release string is what a narrow terminal cuts.
            first.push(Span::raw(format!(
                "  {}  #{} every {:.1}s  policy {}  cgroup {}  kernel {}",
                h.host, model.cycle, h.interval_s, policy, h.cgroup_mode, h.kernel
            )));
        }
        None => first.push(Span::raw("  waiting for the agent...")),
    }
    lines.push(Line::from(first));
    if model.disks.is_empty() {
        lines.push(Line::from("no disk I/O this cycle").dark_gray());
    }
    for d in model.disks.iter().take(HEADER_DISKS) {
        let util_style = match d.utilization {
            u if u >= 0.9 => Style::new().fg(Color::Red),
            u if u >= 0.6 => Style::new().fg(Color::Yellow),
            _ => Style::new().fg(Color::Green),
        };
        lines.push(Line::from(vec![
            Span::styled(
                format!("{:<8}", d.name.as_deref().unwrap_or(&d.dev)),
                Style::new().bold(),
            ),
            Span::raw(format!("{:<8} util ", d.dev)),
            Span::styled(format!("{:>3.0}%", d.utilization * 100.0), util_style),
            Span::raw(format!(
                "  read {:>7} MB/s  write {:>7} MB/s  {:>7} IOPS",
                mbps(d.read_mbps),
                mbps(d.write_mbps),
                count(d.iops)
            )),
        ]));
    }
    f.render_widget(Paragraph::new(lines), area);
}

fn state_style(s: State) -> Style {
    match s {
        State::Violating => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        State::Throttled => Style::new().fg(Color::Yellow),
        State::Ok => Style::new().fg(Color::Green),
        State::Unconfigured => Style::new().fg(Color::DarkGray),
    }
}

fn state_word(s: State) -> &'static str {
    match s {
        State::Unconfigured => "unconf",
        s => s.label(),
    }
}

fn mbps(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn count(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e5 => format!("{:.0}k", v / 1e3),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn bytes_rate(bps: u64) -> String {
    let m = bps as f64 / 1e6;
    if m >= 10.0 {
        format!("{m:.0}M")
    } else {
        format!("{m:.1}M")
    }
}

fn limit_text(l: &crate::policy::IoMaxLimit) -> String {
    let mut parts = vec![];
    if let Some(v) = l.rbps {
        parts.push(format!("r{}", bytes_rate(v)));
    }
    if let Some(v) = l.wbps {
        parts.push(format!("w{}", bytes_rate(v)));
    }
    if let Some(v) = l.riops {
        parts.push(format!("ri{}", count(v as f64)));
    }
    if let Some(v) = l.wiops {
        parts.push(format!("wi{}", count(v as f64)));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

fn slo_text(s: &Option<SloClass>) -> String {
    match s {
        Some(SloClass::Latency(t)) if t.quantile == LatencyQuantile::P999 => {
            latency_words(t.target_ns)
        }
        Some(SloClass::Latency(t)) => {
            format!("{} {}", t.quantile.label(), latency_words(t.target_ns))
        }
        Some(SloClass::Throughput { rate_bps }) => format!("{:.0}MB/s", *rate_bps as f64 / 1e6),
        _ => "-".into(),
    }
}

fn cell(r: &Row, c: Column) -> Cell<'static> {
    match c {
        Column::Name => Cell::from(r.name.clone()),
        Column::Kind => Cell::from(r.kind.clone()),
        Column::Class => Cell::from(
            r.slo
                .as_ref()
                .map(|s| s.name().to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        Column::Slo => {
            // A target at another quantile than p99.9 is judged on the latency there, which
            // no column shows: its cell says when it is over.
            let over = match (&r.slo, r.slo_latency_ns) {
                (Some(SloClass::Latency(t)), Some(l)) => l > t.target_ns,
                _ => false,
            };
            let c = Cell::from(slo_text(&r.slo));
            if over {
                c.style(Style::new().fg(Color::Red))
            } else {
                c
            }
        }
        Column::P50 => Cell::from(ns(r.p50_ns)),
        Column::P999 => {
            let over = match (&r.slo, r.p999_ns) {
                (Some(SloClass::Latency(t)), Some(p)) if t.quantile == LatencyQuantile::P999 => {
                    p > t.target_ns
                }
                _ => false,
            };
            let c = Cell::from(ns(r.p999_ns));
            if over {
                c.style(Style::new().fg(Color::Red))
            } else {
                c
            }
        }
        Column::Samples => Cell::from(count(r.samples as f64)),
        Column::Read => Cell::from(mbps(r.read_mbps)),
        Column::Write => Cell::from(mbps(r.write_mbps)),
        Column::Iops => Cell::from(count(r.iops)),
        Column::Inflight => Cell::from(format!("{:.1}", r.inflight)),
        Column::Limit => Cell::from(limit_text(&r.limit)),
        Column::State => Cell::from(state_word(r.state)).style(state_style(r.state)),
        Column::Vio => Cell::from(
            r.vio
                .map(|v| format!("{v:+.2}"))
                .unwrap_or_else(|| "-".into()),
        ),
    }
}

fn render_table(f: &mut Frame, app: &App, area: Rect) {
    let rows = app.rows();
    let cols = columns_for(area.width);
    let header = TableRow::new(cols.iter().map(|&(c, _)| {
        let style = if c == app.sort {
            Style::new().reversed().bold()
        } else {
            Style::new().bold()
        };
        Cell::from(c.title()).style(style)
    }))
    .underlined();
    if rows.is_empty() {
        let msg = if app.filter.is_empty() {
            "no block I/O seen yet".to_string()
        } else {
            format!("nothing matches '{}' (Esc clears the filter)", app.filter)
        };
        let [h, m] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(area);
        f.render_widget(
            Table::new(Vec::<TableRow>::new(), cols.iter().map(|c| c.1)).header(header),
            h,
        );
        f.render_widget(Paragraph::new(msg).dark_gray(), m);
        return;
    }
    let selected = app.selected_index(&rows);
    let body: Vec<TableRow> = rows
        .iter()
        .map(|r| TableRow::new(cols.iter().map(|&(c, _)| cell(r, c))))
        .collect();
    let table = Table::new(body, cols.iter().map(|c| Constraint::Length(c.1)))
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::new().reversed());
    let mut state = TableState::default().with_selected(Some(selected));
    f.render_stateful_widget(table, area, &mut state);
}

fn action_style(k: ActionKind) -> Style {
    match k {
        ActionKind::Decision => Style::new().fg(Color::Cyan),
        ActionKind::ViolationStart | ActionKind::Error => Style::new().fg(Color::Red),
        ActionKind::ViolationEnd => Style::new().fg(Color::Green),
        ActionKind::Restore => Style::new().fg(Color::Magenta),
        ActionKind::Warning => Style::new().fg(Color::Yellow),
        ActionKind::Info => Style::new(),
    }
}

fn action_line(a: &Action) -> Line<'static> {
    let cycle = a.cycle.map(|c| format!("#{c}")).unwrap_or_default();
    Line::from(vec![
        Span::styled(
            format!("{} {:>5} ", a.time, cycle),
            Style::new().dark_gray(),
        ),
        Span::styled(a.text.clone(), action_style(a.kind)),
    ])
}

fn render_detail(f: &mut Frame, app: &App, area: Rect) {
    let Some(row) = app.selected_row() else {
        f.render_widget(
            Paragraph::new("no row selected").block(Block::bordered()),
            area,
        );
        return;
    };
    let model = app.model();
    let what = match &row.key {
        RowKey::Service(_) => match &row.slo {
            Some(slo @ (SloClass::Latency(_) | SloClass::Throughput { .. })) => {
                format!("{} · {} {}", row.kind, slo.name(), slo_text(&row.slo))
            }
            _ => format!("{} · best-effort", row.kind),
        },
        RowKey::Cgroup(id) => format!("{} · id {id} · no SLO", row.kind),
    };
    let block = Block::bordered().title(Line::from(vec![
        Span::styled(format!(" {} ", row.name), Style::new().bold()),
        Span::raw(format!("{what} ")),
        Span::styled(
            format!(" {} ", state_word(row.state)),
            state_style(row.state),
        ),
    ]));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(inner);

    // Left: the latency distribution, then where the row's I/O comes from and its actions.
    let mut lines: Vec<Line> = vec![];
    if !row.latency_log2.is_empty() {
        lines.push(Line::from(format!("latency this cycle ({} requests)", row.samples)).bold());
        let top = row
            .latency_log2
            .iter()
            .map(|p| p.1)
            .max()
            .unwrap_or(1)
            .max(1);
        let bar_w = left.width.saturating_sub(18) as u64;
        for &(upper, n) in &row.latency_log2 {
            // In u128: a count near u64::MAX times the width must not overflow.
            let len = (u128::from(n) * u128::from(bar_w)).div_ceil(u128::from(top)) as usize;
            lines.push(Line::from(vec![
                Span::raw(format!("<{:>7} ", latency_words(upper))),
                Span::styled("█".repeat(len), Style::new().fg(Color::Cyan)),
                Span::raw(format!(" {}", count(n as f64))),
            ]));
        }
    } else if !row.latency_by_op.is_empty() {
        lines.push(Line::from("latency (window)   n    p50   p99 p99.9").bold());
        for o in &row.latency_by_op {
            lines.push(Line::from(format!(
                "{:<5} {:<6} {:>5} {:>6} {:>5} {:>5}",
                truncate(&o.disk, 5),
                o.op,
                count(o.latency.samples as f64),
                ns(o.latency.p50_ns),
                ns(o.latency.p99_ns),
                ns(o.latency.p999_ns)
            )));
        }
    } else {
        lines.push(Line::from("no I/O this cycle").dark_gray());
    }
    if !row.characters.is_empty() {
        lines.push(Line::from("character (window)  reads  seq  <=4K <=16K <=64K <=256K  >").bold());
        for (disk, c) in &row.characters {
            let share = |n: u64| format!("{:>3.0}%", n as f64 * 100.0 / c.ios.max(1) as f64);
            let sizes: Vec<String> = c.size_ios.iter().map(|&n| share(n)).collect();
            lines.push(Line::from(format!(
                "{:<5} {:<10} {:>4.0}% {:>3.0}% {}",
                truncate(disk, 5),
                c.class.map_or("too few", |k| k.as_str()),
                c.read_ios_fraction * 100.0,
                c.sequential_fraction * 100.0,
                sizes.join("  ")
            )));
        }
    }
    if !row.cgroups.is_empty() {
        lines.push(Line::from(format!("cgroups: {}", row.cgroups.join(", "))).dark_gray());
    }
    lines.push(Line::from("recent actions").bold());
    let mut any = false;
    for a in model.actions_of(row).take(8) {
        lines.push(action_line(a));
        any = true;
    }
    if !any {
        lines.push(Line::from("none").dark_gray());
    }
    f.render_widget(
        Paragraph::new(lines).wrap(ratatui::widgets::Wrap { trim: false }),
        left,
    );

    // Right: the last minutes as sparklines.
    // The newest points that fit the width, scaled to integers for the sparkline.
    let width = right.width.saturating_sub(1) as usize;
    let points = &row.history.0;
    let recent = || points.iter().skip(points.len().saturating_sub(width));
    let p999: Vec<u64> = recent().map(|p| p.p999_ns.unwrap_or(0) / 1000).collect();
    let mb: Vec<u64> = recent().map(|p| (p.mbps * 10.0) as u64).collect();
    let limit: Vec<u64> = recent()
        .map(|p| p.limit_bps.unwrap_or(0) / 100_000)
        .collect();
    let span = |n: usize| {
        let secs = n as f64 * model.header.as_ref().map_or(1.0, |h| h.interval_s);
        if secs >= 120.0 {
            format!("{:.0} min", secs / 60.0)
        } else {
            format!("{secs:.0} s")
        }
    };
    let graphs = [
        (
            format!(
                "p99.9 {}{}, last {}",
                ns(row.p999_ns),
                match row.slo {
                    Some(SloClass::Latency(t)) if t.quantile != LatencyQuantile::P999 => format!(
                        " ({} {}, SLO {})",
                        t.quantile.label(),
                        ns(row.slo_latency_ns),
                        slo_text(&row.slo)
                    ),
                    Some(SloClass::Latency(_)) => format!(" (SLO {})", slo_text(&row.slo)),
                    _ => String::new(),
                },
                span(p999.len())
            ),
            p999,
            Color::Red,
        ),
        (
            format!(
                "MB/s {} (r {} w {})",
                mbps(row.mbps()),
                mbps(row.read_mbps),
                mbps(row.write_mbps)
            ),
            mb,
            Color::Cyan,
        ),
        (
            format!("limit {}", limit_text(&row.limit)),
            limit,
            Color::Yellow,
        ),
    ];
    let rows = Layout::vertical([Constraint::Ratio(1, 3); 3]).split(right);
    for ((title, data, color), r) in graphs.into_iter().zip(rows.iter()) {
        let [t, g] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(*r);
        f.render_widget(Paragraph::new(title), t);
        f.render_widget(
            Sparkline::default()
                .data(&data)
                .style(Style::new().fg(color)),
            g,
        );
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn render_actions(f: &mut Frame, app: &App, area: Rect) {
    let model = app.model();
    let block = Block::default().borders(Borders::TOP).title(format!(
        " actions ({}), newest first; a or Esc to close ",
        model.actions.len()
    ));
    let lines: Vec<Line> = model
        .actions
        .iter()
        .rev()
        .skip(app.actions_scroll)
        .map(action_line)
        .collect();
    let body = if lines.is_empty() {
        Paragraph::new("no actions yet").dark_gray()
    } else {
        Paragraph::new(lines).wrap(ratatui::widgets::Wrap { trim: false })
    };
    f.render_widget(body.block(block), area);
}

fn render_status(f: &mut Frame, app: &App, area: Rect) {
    if let Some(text) = &app.goto {
        let n = app.replay.as_ref().map_or(0, |r| r.recording().len());
        f.render_widget(
            Paragraph::new(format!(
                "go to: {text}_   (cycle 1-{n}, +N/-N cycles, +5m, 10:54:30; Enter goes, Esc cancels)"
            ))
            .style(Style::new().reversed()),
            area,
        );
        return;
    }
    if app.editing_filter {
        f.render_widget(
            Paragraph::new(format!(
                "filter: {}_   (Enter keeps it, Esc clears it)",
                app.filter
            ))
            .style(Style::new().reversed()),
            area,
        );
        return;
    }
    let link = match &app.replay {
        Some(r) => replay_status(app, r),
        None => link_status(app),
    };
    let mut right = format!(
        "sort {}{}",
        app.sort.title(),
        if app.reverse { " (rev)" } else { "" }
    );
    if !app.filter.is_empty() {
        right.push_str(&format!("  filter '{}'", app.filter));
    }
    if app.replay.is_some() {
        right.push_str("  space play  \u{2190}\u{2192} step  : go to");
    }
    right.push_str("  h help  q quit");
    // A broken link matters more than the key hints: they give way when both do not fit.
    let right_w = right.chars().count() as u16;
    let right_w = if link.width() as u16 + 1 + right_w <= area.width {
        right_w
    } else {
        0
    };
    let [l, r] = Layout::horizontal([Constraint::Min(10), Constraint::Length(right_w)]).areas(area);
    f.render_widget(Paragraph::new(link), l);
    f.render_widget(Paragraph::new(right).dark_gray(), r);
}

fn link_status(app: &App) -> Line<'static> {
    Line::from(match app.link() {
        Link::Connecting => Span::raw(format!("connecting to {}", app.source)),
        Link::Live => Span::styled(app.source.clone(), Style::new().fg(Color::Green)),
        Link::Stopped(why) => Span::styled(
            format!("agent stopped ({why}); waiting for it to come back"),
            Style::new().fg(Color::Yellow),
        ),
        Link::Lost(why) => Span::styled(
            format!("agent gone: {why}; reconnecting"),
            Style::new().fg(Color::Red).bold(),
        ),
    })
}

/// Which recording, which cycle of how many, when it was recorded, and whether it plays.
fn replay_status(app: &App, r: &Replay) -> Line<'static> {
    let rec = r.recording();
    let c = r.current();
    let mut text = format!(
        "{}  cycle {}/{}  {}",
        app.source,
        r.position() + 1,
        rec.len(),
        c.ts.as_deref().unwrap_or("no timestamp")
    );
    if rec.runs > 1 {
        text.push_str(&format!("  run {}/{}", c.run, rec.runs));
    }
    let mut spans = vec![];
    // First: a refused jump is what the reader looks for, and the end is news.
    if let Some(note) = &r.note {
        spans.push(Span::styled(
            format!("{note}  "),
            Style::new().fg(Color::Red).bold(),
        ));
    }
    spans.push(Span::raw(text));
    spans.push(if r.playing {
        let speed = if r.speed > 1 {
            format!(" {}x", r.speed)
        } else {
            String::new()
        };
        Span::styled(
            format!("  playing{speed}"),
            Style::new().fg(Color::Green).bold(),
        )
    } else {
        Span::styled("  paused", Style::new().fg(Color::Yellow).bold())
    });
    if rec.broken > 0 {
        spans.push(Span::styled(
            format!(
                "  {} broken line{} skipped",
                rec.broken,
                if rec.broken == 1 { "" } else { "s" }
            ),
            Style::new().fg(Color::Yellow),
        ));
    }
    Line::from(spans)
}

const HELP: &[(&str, &str)] = &[
    ("Up/k Down/j", "move the selection (PgUp/PgDn, g/G: jump)"),
    ("s >  <", "sort by the next / previous column"),
    ("r", "reverse the sort"),
    ("/", "filter rows (name, kind, class, state, cgroup, disk)"),
    ("Enter", "detail: latency histogram, history, actions"),
    ("a", "action log (decisions, violations, restores)"),
    ("p or space", "pause the display (data keeps coming)"),
    ("Esc", "close a pane, clear the filter"),
    ("h ?", "this help"),
    ("q Ctrl-C", "quit"),
];

/// The replay's own keys (`--replay`); space and p play instead of freezing the view.
const REPLAY_HELP: &[(&str, &str)] = &[
    (
        "space p",
        "play / pause at the recorded pace (at the end: again)",
    ),
    ("Right/t Left/T", "next / previous cycle"),
    ("[  ]", "first / last cycle"),
    ("+ -", "play faster / slower (1x to 64x)"),
    (":", "go to: cycle 120, +10/-10 cycles, +5m/-30s, 10:54:30"),
];

fn render_help(f: &mut Frame, app: &App, area: Rect) {
    let keys: Vec<(&str, &str)> = match app.replay {
        Some(_) => REPLAY_HELP
            .iter()
            .chain(HELP.iter().filter(|(k, _)| *k != "p or space"))
            .copied()
            .collect(),
        None => HELP.to_vec(),
    };
    let w = area.width.min(72);
    let h = (keys.len() as u16 + 6).min(area.height);
    let r = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let key_w = keys.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
    let mut lines: Vec<Line> = keys
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:<key_w$}"), Style::new().bold()),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    for l in [
        "violating: misses its SLO this cycle   throttled: the agent limits it",
        "ok: within its SLO   unconf: a cgroup no service claims (no SLO)",
    ] {
        lines.push(Line::from(l).dark_gray());
    }
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" isolator top: keys ")),
        r,
    );
}

#[cfg(test)]
mod tests {
    use ratatui::{
        backend::TestBackend,
        crossterm::event::{KeyCode, KeyEvent},
        Terminal,
    };

    use super::*;
    use crate::top::model::tests::recorded_until;

    /// The app with the recorded stream up to `cycle`.
    fn app_at(cycle: u64) -> App {
        let mut app = App::new("agent on /run/isolator/isolator.sock".into());
        *app.live_mut() = recorded_until(cycle);
        app
    }

    fn draw(app: &App, w: u16, h: u16) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| render(f, app)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect()
    }

    fn key(app: &mut App, code: KeyCode) {
        app.key(KeyEvent::from(code));
    }

    fn line_with<'a>(screen: &'a [String], needle: &str) -> &'a str {
        screen
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in\n{}", screen.join("\n")))
    }

    #[test]
    fn table_at_80x24_fits_the_essential_columns() {
        let app = app_at(8);
        let screen = draw(&app, 80, 24);
        assert!(screen[0].starts_with("isolator top  vm  #8 every 1.0s  policy adaptive"));
        assert!(
            screen[1].starts_with("vda     254:0    util  83%"),
            "{}",
            screen[1]
        );
        let header = line_with(&screen, "NAME");
        for title in [
            "STATE", "P99.9", " N ", "SLO", "RD MB/s", "WR MB/s", "LIMIT", "VIO",
        ] {
            assert!(header.contains(title), "{title} missing from {header}");
        }
        for title in ["KIND", "CLASS", "IOPS", "P50", "INFL"] {
            assert!(!header.contains(title), "{title} does not fit 80 columns");
        }
        let db = line_with(&screen, "db ");
        assert!(db.contains("6.0ms") && db.contains("8.1ms") && db.contains("violating"));
        assert!(db.contains("8364") && db.contains("+0.34"), "{db}");
        let backup = line_with(&screen, "backup");
        assert!(
            backup.contains("636.4") && backup.contains("w116M") && backup.contains("throttled")
        );
        assert!(line_with(&screen, "unattributed").contains("unconf"));
        assert!(screen[23].starts_with("agent on /run/isolator/isolator.sock"));
        assert!(screen[23].ends_with("sort STATE  h help  q quit"));
    }

    #[test]
    fn states_are_coloured() {
        let app = app_at(8);
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        t.draw(|f| render(f, &app)).unwrap();
        let screen = draw(&app, 80, 24);
        let buf = t.backend().buffer().clone();
        let colour_of = |word: &str| {
            let (y, l) = screen
                .iter()
                .enumerate()
                .find(|(_, l)| l.contains(word))
                .unwrap();
            let x = l.find(word).unwrap() as u16;
            buf[(x, y as u16)].fg
        };
        assert_eq!(colour_of("violating"), Color::Red);
        assert_eq!(colour_of("throttled"), Color::Yellow);
        assert_eq!(colour_of("unconf"), Color::DarkGray);
    }

    #[test]
    fn table_at_160x48_shows_every_column() {
        let app = app_at(8);
        let screen = draw(&app, 160, 48);
        let header = line_with(&screen, "NAME");
        for c in Column::ALL {
            assert!(
                header.contains(c.title()),
                "{} missing from {header}",
                c.title()
            );
        }
        assert!(line_with(&screen, "db ").contains("latency"));
        assert!(line_with(&screen, "backup").contains("best-effort"));
        assert!(screen[0].contains("kernel 6.18.44-fc-v669"));
        assert!(screen[47].contains("sort STATE"));
    }

    #[test]
    fn detail_pane_shows_histogram_history_and_the_rows_actions() {
        let mut app = app_at(8);
        key(&mut app, KeyCode::Down); // backup, second under sort by state
        key(&mut app, KeyCode::Enter);
        assert_eq!(app.pane, Pane::Detail);
        let screen = draw(&app, 80, 24);
        assert!(line_with(&screen, "┌ backup").contains("best-effort"));
        line_with(&screen, "latency this cycle (1157 requests)");
        line_with(&screen, "limit w116M");
        line_with(&screen, "MB/s 636.4");
        assert!(line_with(&screen, "backup: wbps unlimited").contains("#7"));
        // db's pane has its own actions, not backup's.
        key(&mut app, KeyCode::Up);
        let screen = draw(&app, 160, 48);
        line_with(&screen, "p99.9 8.1ms (SLO 6.0ms)");
        line_with(&screen, "db violates its SLO on 254:0");
        assert!(!screen.iter().any(|l| l.contains("wbps unlimited")));
        assert!(line_with(&screen, "┌ db").contains("cgroup · latency 6.0ms"));
        // An unconfigured cgroup shows its percentiles per operation.
        key(&mut app, KeyCode::End);
        let screen = draw(&app, 160, 48);
        line_with(&screen, "latency (window)");
    }

    #[test]
    fn action_log_help_filter_pause_and_a_lost_agent() {
        let mut app = app_at(8);
        key(&mut app, KeyCode::Char('a'));
        let screen = draw(&app, 80, 24);
        line_with(&screen, "actions (4), newest first");
        // Newest first.
        let first = screen
            .iter()
            .position(|l| l.contains("wbps unlimited"))
            .unwrap();
        let second = screen
            .iter()
            .position(|l| l.contains("db violates"))
            .unwrap();
        assert!(first < second);
        key(&mut app, KeyCode::Esc);
        key(&mut app, KeyCode::Char('?'));
        line_with(&draw(&app, 80, 24), "isolator top: keys");
        key(&mut app, KeyCode::Char('h'));

        key(&mut app, KeyCode::Char('/'));
        for c in "back".chars() {
            key(&mut app, KeyCode::Char(c));
        }
        let screen = draw(&app, 80, 24);
        assert!(screen[23].starts_with("filter: back_"));
        assert!(!screen.iter().any(|l| l.starts_with("db ")));
        key(&mut app, KeyCode::Enter);
        assert!(draw(&app, 80, 24)[23].contains("filter 'back'"));
        key(&mut app, KeyCode::Char('/'));
        for _ in 0..4 {
            key(&mut app, KeyCode::Backspace);
        }
        key(&mut app, KeyCode::Char('z'));
        key(&mut app, KeyCode::Enter);
        line_with(
            &draw(&app, 80, 24),
            "nothing matches 'z' (Esc clears the filter)",
        );
        key(&mut app, KeyCode::Esc);

        key(&mut app, KeyCode::Char('p'));
        for l in crate::top::model::tests::RECORDED.lines() {
            app.ingest_line(l).unwrap();
        }
        let screen = draw(&app, 80, 24);
        assert!(
            screen[0].contains("#8") && screen[0].contains("PAUSED"),
            "{}",
            screen[0]
        );
        key(&mut app, KeyCode::Char('p'));
        assert!(draw(&app, 80, 24)[0].contains("#19"));
        assert!(draw(&app, 80, 24)[23].contains("agent stopped (SIGTERM)"));

        app.live_mut().link = crate::top::model::Link::Live;
        app.live_mut()
            .lost("no agent on /run/isolator/isolator.sock".into());
        assert!(draw(&app, 80, 24)[23]
            .starts_with("agent gone: no agent on /run/isolator/isolator.sock; reconnecting"));
    }

    #[test]
    fn replay_steps_forward_and_back_to_the_same_screens() {
        let mut app = App::replaying(
            "replay noisy-neighbor.ndjson".into(),
            crate::top::replay::tests::recorded(),
        );
        let screen = draw(&app, 80, 24);
        assert!(
            screen[0].starts_with("isolator top REPLAY  vm  #1 every 1.0s"),
            "{}",
            screen[0]
        );
        assert!(
            screen[23].starts_with(
                "replay noisy-neighbor.ndjson  cycle 1/19  2026-11-23T10:54:21.894Z  paused"
            ),
            "{}",
            screen[23]
        );
        // To cycle 8 one step at a time: the same values as the live view of cycle 8.
        for _ in 0..7 {
            key(&mut app, KeyCode::Right);
        }
        let eighth = draw(&app, 80, 24);
        assert!(eighth[0].contains("#8"), "{}", eighth[0]);
        assert!(
            eighth[23].contains("cycle 8/19  2026-11-23T10:54:28.89"),
            "{}",
            eighth[23]
        );
        let db = line_with(&eighth, "db ");
        assert!(
            db.contains("8.1ms") && db.contains("violating") && db.contains("+0.34"),
            "{db}"
        );
        assert!(line_with(&eighth, "backup").contains("w116M"));
        // Back one: cycle 7, before the cap on backup.
        key(&mut app, KeyCode::Left);
        let seventh = draw(&app, 80, 24);
        assert!(seventh[0].contains("#7") && seventh[23].contains("cycle 7/19"));
        assert!(!line_with(&seventh, "backup").contains("w116M"));
        assert_ne!(seventh, eighth);
        // And forward again: the screen it was.
        key(&mut app, KeyCode::Char('t'));
        assert_eq!(draw(&app, 80, 24), eighth);
        // From the end, back with T, and the jumps.
        key(&mut app, KeyCode::Char(']'));
        let last = draw(&app, 80, 24);
        assert!(last[23].contains("cycle 19/19"), "{}", last[23]);
        key(&mut app, KeyCode::Char('T'));
        key(&mut app, KeyCode::Right);
        assert_eq!(draw(&app, 80, 24), last);
        key(&mut app, KeyCode::Char(':'));
        for c in "8".chars() {
            key(&mut app, KeyCode::Char(c));
        }
        assert!(draw(&app, 80, 24)[23].starts_with("go to: 8_"));
        key(&mut app, KeyCode::Enter);
        assert_eq!(draw(&app, 80, 24), eighth);
        key(&mut app, KeyCode::Char(':'));
        key(&mut app, KeyCode::Char('x'));
        key(&mut app, KeyCode::Enter);
        assert!(draw(&app, 80, 24)[23].starts_with("'x' is not a cycle or a time"));
        key(&mut app, KeyCode::Char('['));
        assert!(draw(&app, 80, 24)[23].contains("cycle 1/19"));
        // Playing, faster; the help lists the replay keys.
        key(&mut app, KeyCode::Char(' '));
        key(&mut app, KeyCode::Char('+'));
        let screen = draw(&app, 160, 24);
        assert!(screen[23].contains("playing 2x"), "{}", screen[23]);
        assert!(screen[23].contains("space play"), "{}", screen[23]);
        key(&mut app, KeyCode::Char('?'));
        let help = draw(&app, 80, 24);
        line_with(&help, "Right/t Left/T  next / previous cycle");
        line_with(&help, "go to: cycle 120");
        assert!(!help.iter().any(|l| l.contains("data keeps coming")));
    }

    #[test]
    fn a_replay_with_broken_lines_says_so() {
        let mut text = String::new();
        for (i, l) in crate::top::model::tests::RECORDED.lines().enumerate() {
            text.push_str(l);
            text.push('\n');
            if i == 3 {
                text.push_str("not json\n");
            }
        }
        let rec = crate::top::replay::Recording::parse(text).unwrap();
        let app = App::replaying("replay r".into(), crate::top::replay::Replay::new(rec));
        assert!(draw(&app, 100, 24)[23].contains("paused  1 broken line skipped"));
    }

    #[test]
    fn a_terminal_too_small_is_said_not_garbled() {
        let app = app_at(8);
        let screen = draw(&app, 50, 10);
        let text = screen.join(" ");
        assert!(text.contains("terminal too small (50x10)"), "{text}");
        assert!(!text.contains("NAME"));
        // Resizing back draws the full view.
        line_with(&draw(&app, 80, 24), "NAME");
        // Before the first event: a waiting header, no rows.
        let empty = App::new("agent on s".into());
        let screen = draw(&empty, 80, 24);
        assert!(screen[0].contains("waiting for the agent"));
        line_with(&screen, "no block I/O seen yet");
    }

    #[test]
    fn counts_at_the_extremes_draw() {
        let mut app = App::new("test".into());
        let max = u64::MAX;
        for l in [
            serde_json::json!({"schema": 1, "type": "service_stats", "cycle": 1, "service": "s",
                "disk": "vda", "state": "violating", "samples": max, "p50_ns": max, "p999_ns": max,
                "latency_log2": [[1024, max], [max, 1]], "slo": {"class": "latency", "p999_ns": max},
                "limit": {"rbps": max, "wbps": max, "riops": max}, "vio": f64::MAX,
                "read_mbps": f64::MAX, "iops": f64::MAX}),
            serde_json::json!({"schema": 1, "type": "cycle_end", "cycle": 1,
                "disks": [{"dev": "254:0", "disk": "vda", "utilization": f64::MAX}]}),
        ] {
            app.ingest_line(&l.to_string()).unwrap();
        }
        draw(&app, 80, 24);
        key(&mut app, KeyCode::Enter);
        line_with(&draw(&app, 80, 24), "latency this cycle");
    }

    mod props {
        use proptest::prelude::*;
        use ratatui::crossterm::event::KeyCode;

        use super::{draw, key};
        use crate::top::{app::App, model::tests::arb};

        /// Draws every pane of the app at two sizes, each row's detail included.
        fn draw_all(app: &mut App) {
            for (w, h) in [(80, 24), (160, 48)] {
                draw(app, w, h);
                key(app, KeyCode::Char('a'));
                draw(app, w, h);
                key(app, KeyCode::Char('a'));
                for _ in 0..app.rows().len().min(8) {
                    key(app, KeyCode::Enter);
                    draw(app, w, h);
                    key(app, KeyCode::Enter);
                    key(app, KeyCode::Down);
                }
            }
        }

        proptest! {
            // Drawing is the slow part: fewer cases.
            #![proptest_config(crate::proptest_budget(64))]

            /// Whatever the agent says, top draws it (bad lines refused by the model).
            #[test]
            fn any_stream_draws(
                lines in prop_oneof![
                    arb::mutated_stream(),
                    arb::extreme_stream(),
                    prop::collection::vec(arb::mutated_line(), 1..8),
                    prop::collection::vec(arb::event(), 1..8),
                ]
            ) {
                let mut app = App::new("test".into());
                for l in &lines {
                    let _ = app.ingest_line(l);
                }
                draw_all(&mut app);
            }
        }
    }
}
