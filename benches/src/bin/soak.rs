//! The churn soak at full size (root): 10,000 cgroups created, doing one read each and
//! removed again, in waves, while the agent limits every one of them. Prints the agent's
//! RSS and the journal's size per wave, and fails if either grows or anything is left.
//!
//!   cargo run --release -p isolator-benches --bin soak -- [--cgroups 10000] [--wave 500]

use isolator_tests::churn;

fn main() {
    let mut cgroups = 10_000;
    let mut wave = 500;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> usize {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                eprintln!("{name} needs a number; e.g. {name} 500");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--cgroups" => cgroups = num("--cgroups"),
            "--wave" => wave = num("--wave"),
            other => {
                eprintln!("unknown argument '{other}'; use --cgroups N --wave N");
                std::process::exit(2)
            }
        }
    }
    let r = churn::run(cgroups, wave);
    println!("| wave | cgroups so far | agent RSS KiB | journal entries |");
    println!("|---|---|---|---|");
    for (i, (rss, j)) in r.rss_kib.iter().zip(&r.journal_entries).enumerate() {
        println!(
            "| {} | {} | {rss} | {j} |",
            i + 1,
            ((i + 1) * wave).min(cgroups)
        );
    }
    println!(
        "\n{} cgroups in waves of {} in {:.0} s; decisions applied {}; tracked keys {} before, {} after; failed restores {}; cgroups left {}; journal left {}",
        r.cgroups,
        r.wave,
        r.seconds,
        r.decisions_applied,
        r.tracked_keys_before,
        r.tracked_keys_after,
        r.restores_failed,
        r.left_cgroups.len(),
        r.journal_left
    );
    r.assert_bounded();
}
