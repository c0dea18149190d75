//! The churn soak, shortened for the suite (the full one, 10,000 cgroups, is the `soak`
//! benchmark): 4,000 cgroups created, doing one read each and removed, in 16 waves of 250,
//! while the agent limits every one of them.

use isolator_tests::churn;

#[test]
fn churn_of_cgroups_leaves_memory_journal_and_maps_bounded() {
    let report = churn::run(4000, 250);
    println!("{report:#?}");
    report.assert_bounded();
}
