//! The view's state (sort, filter, selection, panes, pause, replay) and what each key
//! does. Pure: tests drive it with key events and read the result.

use std::time::Duration;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::{
    model::{Column, Model, Row, RowKey, StreamError},
    replay::Replay,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pane {
    Table,
    /// The selected row's histogram, history and actions under the table.
    Detail,
    /// Every action, newest first.
    Actions,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Quit,
}

pub struct App {
    live: Model,
    /// While paused, the model as it was; the live one keeps taking events.
    frozen: Option<Model>,
    pub sort: Column,
    pub reverse: bool,
    pub filter: String,
    pub editing_filter: bool,
    /// Follows the row, not the position, across re-sorting.
    pub selected: Option<RowKey>,
    pub pane: Pane,
    pub help: bool,
    /// Lines scrolled down in the action log.
    pub actions_scroll: usize,
    /// Where the events come from, for the status line.
    pub source: String,
    /// `--replay`: a recorded stream; the screen shows its model, not `live`.
    pub replay: Option<Replay>,
    /// The replay's `:` prompt as typed so far.
    pub goto: Option<String>,
}

impl App {
    pub fn new(source: String) -> App {
        App {
            live: Model::default(),
            frozen: None,
            sort: Column::State,
            reverse: false,
            filter: String::new(),
            editing_filter: false,
            selected: None,
            pane: Pane::Table,
            help: false,
            actions_scroll: 0,
            source,
            replay: None,
            goto: None,
        }
    }

    /// Shows a recording instead of a live stream.
    pub fn replaying(source: String, replay: Replay) -> App {
        App {
            replay: Some(replay),
            ..App::new(source)
        }
    }

    /// Time passed: a playing replay moves on.
    pub fn tick(&mut self, elapsed: Duration) {
        if let Some(r) = &mut self.replay {
            r.tick(elapsed);
        }
    }

    /// How long the view may wait for input before the replay's next cycle is due.
    pub fn until_next(&self) -> Option<Duration> {
        self.replay.as_ref().and_then(Replay::until_next)
    }

    pub fn ingest_line(&mut self, line: &str) -> Result<(), StreamError> {
        self.live.ingest_line(line)
    }

    pub fn live_mut(&mut self) -> &mut Model {
        &mut self.live
    }

    /// What the screen shows: the replay's cycle, or the frozen model while paused.
    pub fn model(&self) -> &Model {
        if let Some(r) = &self.replay {
            return r.model();
        }
        self.frozen.as_ref().unwrap_or(&self.live)
    }

    pub fn paused(&self) -> bool {
        match &self.replay {
            Some(r) => !r.playing,
            None => self.frozen.is_some(),
        }
    }

    /// The connection as it is now, paused or not.
    pub fn link(&self) -> &super::model::Link {
        &self.live.link
    }

    /// The replay's keys; false when `code` is not one (or this is no replay).
    fn replay_key(&mut self, code: KeyCode) -> bool {
        let Some(r) = &mut self.replay else {
            return false;
        };
        match code {
            KeyCode::Char(' ') | KeyCode::Char('p') => r.toggle(),
            KeyCode::Right | KeyCode::Char('t') => r.step(1),
            KeyCode::Left | KeyCode::Char('T') => r.step(-1),
            KeyCode::Char('[') => r.first(),
            KeyCode::Char(']') => r.last(),
            KeyCode::Char('+') | KeyCode::Char('=') => r.faster(),
            KeyCode::Char('-') => r.slower(),
            KeyCode::Char(':') => {
                r.note = None;
                self.goto = Some(String::new());
            }
            _ => return false,
        }
        true
    }

    pub fn rows(&self) -> Vec<&Row> {
        self.model().visible(self.sort, self.reverse, &self.filter)
    }

    /// Index of the selected row among `rows` (the first when none or gone).
    pub fn selected_index(&self, rows: &[&Row]) -> usize {
        self.selected
            .as_ref()
            .and_then(|k| rows.iter().position(|r| &r.key == k))
            .unwrap_or(0)
    }

    pub fn selected_row(&self) -> Option<&Row> {
        let rows = self.rows();
        rows.get(self.selected_index(&rows)).copied()
    }

    fn move_selection(&mut self, by: isize) {
        let rows = self.rows();
        if rows.is_empty() {
            return;
        }
        let i = self.selected_index(&rows) as isize;
        let j = (i + by).clamp(0, rows.len() as isize - 1) as usize;
        self.selected = Some(rows[j].key.clone());
    }

    /// Down the action log, never past its oldest action.
    fn scroll_actions(&mut self, by: usize) {
        let last = self.model().actions.len().saturating_sub(1);
        self.actions_scroll = (self.actions_scroll + by).min(last);
    }

    pub fn key(&mut self, k: KeyEvent) -> Flow {
        // Ctrl-C quits; no other binding takes Ctrl: a NUL byte on the terminal reads as
        // Ctrl+Space (seen under `script` with stdin at /dev/null), and Space would pause the
        // screen. Alt stays as it was: an Esc and a key that arrive in one read parse as Alt
        // and that key.
        if k.modifiers.contains(KeyModifiers::CONTROL) {
            return match k.code {
                KeyCode::Char('c') => Flow::Quit,
                _ => Flow::Continue,
            };
        }
        if self.editing_filter {
            match k.code {
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => {
                    self.editing_filter = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            return Flow::Continue;
        }
        if let Some(text) = &mut self.goto {
            match k.code {
                KeyCode::Enter => {
                    let text = std::mem::take(text);
                    self.goto = None;
                    if let Some(r) = &mut self.replay {
                        r.goto(&text);
                    }
                }
                KeyCode::Esc => self.goto = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            return Flow::Continue;
        }
        if self.replay_key(k.code) {
            return Flow::Continue;
        }
        let scroll_actions = self.pane == Pane::Actions;
        match k.code {
            KeyCode::Char('q') => return Flow::Quit,
            KeyCode::Char('h') | KeyCode::Char('?') => self.help = !self.help,
            KeyCode::Esc => {
                if self.help {
                    self.help = false;
                } else if self.pane != Pane::Table {
                    self.pane = Pane::Table;
                } else {
                    self.filter.clear();
                }
            }
            KeyCode::Up | KeyCode::Char('k') if scroll_actions => {
                self.actions_scroll = self.actions_scroll.saturating_sub(1)
            }
            KeyCode::Down | KeyCode::Char('j') if scroll_actions => self.scroll_actions(1),
            KeyCode::PageUp if scroll_actions => {
                self.actions_scroll = self.actions_scroll.saturating_sub(10)
            }
            KeyCode::PageDown if scroll_actions => self.scroll_actions(10),
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-10),
            KeyCode::PageDown => self.move_selection(10),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(isize::MAX / 2),
            KeyCode::Char('s') | KeyCode::Char('>') => self.sort = self.sort.next(),
            KeyCode::Char('<') => self.sort = self.sort.prev(),
            KeyCode::Char('r') | KeyCode::Char('R') => self.reverse = !self.reverse,
            KeyCode::Char('/') => self.editing_filter = true,
            KeyCode::Enter => {
                self.pane = if self.pane == Pane::Detail {
                    Pane::Table
                } else {
                    if self.selected.is_none() {
                        self.selected = self.selected_row().map(|r| r.key.clone());
                    }
                    Pane::Detail
                }
            }
            KeyCode::Char('a') => {
                self.actions_scroll = 0;
                self.pane = if self.pane == Pane::Actions {
                    Pane::Table
                } else {
                    Pane::Actions
                }
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.frozen = match self.frozen.take() {
                    Some(_) => None,
                    None => Some(self.live.clone()),
                }
            }
            _ => {}
        }
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::model::tests::recorded_until;

    fn app() -> App {
        let mut app = App::new("test".into());
        *app.live_mut() = recorded_until(8);
        app
    }

    fn press(app: &mut App, code: KeyCode) -> Flow {
        app.key(KeyEvent::from(code))
    }

    #[test]
    fn a_nul_byte_read_as_ctrl_space_neither_pauses_nor_types() {
        let mut app = app();
        let ctrl = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL);
        assert_eq!(app.key(ctrl(' ')), Flow::Continue);
        assert!(!app.paused(), "Ctrl+Space paused the screen");
        press(&mut app, KeyCode::Char('/'));
        app.key(ctrl(' '));
        assert_eq!(app.filter, "", "Ctrl+Space went into the filter");
        assert_eq!(app.key(ctrl('c')), Flow::Quit);
    }

    #[test]
    fn the_selection_follows_its_row_when_the_sort_changes() {
        let mut app = app();
        assert_eq!(app.selected_row().unwrap().name, "db");
        press(&mut app, KeyCode::Char('j'));
        assert_eq!(app.selected_row().unwrap().name, "backup");
        // Sort by name: backup moves to the top, and stays selected.
        while app.sort != Column::Name {
            press(&mut app, KeyCode::Char('s'));
        }
        let rows = app.rows();
        assert_eq!(
            app.selected_index(&rows),
            rows.iter().position(|r| r.name == "backup").unwrap()
        );
        press(&mut app, KeyCode::Char('<'));
        assert_eq!(app.sort, Column::Vio);
        press(&mut app, KeyCode::Char('>'));
        press(&mut app, KeyCode::Char('r'));
        assert!(app.reverse);
        // Moving never leaves the table.
        for _ in 0..20 {
            press(&mut app, KeyCode::Char('k'));
        }
        assert_eq!(app.selected_index(&app.rows()), 0);
        press(&mut app, KeyCode::End);
        assert_eq!(app.selected_index(&app.rows()), app.rows().len() - 1);
    }

    #[test]
    fn quit_keys_and_typing_a_filter() {
        let mut app = app();
        press(&mut app, KeyCode::Char('/'));
        // While typing a filter, q is a letter.
        assert_eq!(press(&mut app, KeyCode::Char('q')), Flow::Continue);
        assert_eq!(app.filter, "q");
        press(&mut app, KeyCode::Esc);
        assert!(app.filter.is_empty() && !app.editing_filter);
        assert_eq!(press(&mut app, KeyCode::Char('q')), Flow::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        press(&mut app, KeyCode::Char('/'));
        assert_eq!(app.key(ctrl_c), Flow::Quit);
    }

    #[test]
    fn replay_keys_leave_the_views_keys_as_they_were() {
        let mut app = App::replaying("replay f".into(), crate::top::replay::tests::recorded());
        assert!(app.paused());
        press(&mut app, KeyCode::Char('p'));
        assert!(!app.paused());
        press(&mut app, KeyCode::Char(' '));
        assert!(app.paused() && app.until_next().is_none());
        for _ in 0..7 {
            press(&mut app, KeyCode::Right);
        }
        assert_eq!(app.model().cycle, 8);
        // h is still help, j/k/g/G still move the selection.
        press(&mut app, KeyCode::Char('h'));
        assert!(app.help);
        press(&mut app, KeyCode::Char('h'));
        press(&mut app, KeyCode::Char('j'));
        assert_eq!(app.selected_row().unwrap().name, "backup");
        press(&mut app, KeyCode::Char('g'));
        assert_eq!(app.selected_row().unwrap().name, "db");
        assert_eq!(app.model().cycle, 8);
        // The selection follows its row from cycle to cycle.
        press(&mut app, KeyCode::Char('j'));
        press(&mut app, KeyCode::Left);
        assert_eq!(app.model().cycle, 7);
        assert_eq!(app.selected_row().unwrap().name, "backup");
        // While typing where to go, q and digits are text.
        press(&mut app, KeyCode::Char(':'));
        press(&mut app, KeyCode::Char('q'));
        press(&mut app, KeyCode::Backspace);
        press(&mut app, KeyCode::Char('1'));
        assert_eq!(press(&mut app, KeyCode::Char('2')), Flow::Continue);
        assert_eq!(app.goto.as_deref(), Some("12"));
        press(&mut app, KeyCode::Enter);
        assert_eq!(app.model().cycle, 12);
        press(&mut app, KeyCode::Char(':'));
        press(&mut app, KeyCode::Char('1'));
        press(&mut app, KeyCode::Esc);
        assert!(app.goto.is_none());
        assert_eq!(app.model().cycle, 12);
        // Playing moves with time.
        press(&mut app, KeyCode::Char('-'));
        press(&mut app, KeyCode::Char(' '));
        let due = app.until_next().unwrap();
        app.tick(due);
        assert_eq!(app.model().cycle, 13);
        assert_eq!(press(&mut app, KeyCode::Char('q')), Flow::Quit);
    }

    #[test]
    fn panes_open_and_close() {
        let mut app = app();
        press(&mut app, KeyCode::Enter);
        assert_eq!(app.pane, Pane::Detail);
        press(&mut app, KeyCode::Char('a'));
        assert_eq!(app.pane, Pane::Actions);
        press(&mut app, KeyCode::Down);
        assert_eq!(app.actions_scroll, 1);
        for _ in 0..5 {
            press(&mut app, KeyCode::PageDown);
        }
        assert_eq!(app.actions_scroll, app.model().actions.len() - 1);
        press(&mut app, KeyCode::Char('a'));
        assert_eq!(app.pane, Pane::Table);
        press(&mut app, KeyCode::Char('h'));
        assert!(app.help);
        press(&mut app, KeyCode::Esc);
        assert!(!app.help);
        press(&mut app, KeyCode::Enter);
        press(&mut app, KeyCode::Esc);
        assert_eq!(app.pane, Pane::Table);
    }
}
