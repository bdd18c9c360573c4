//! The README's example (`examples/tenants.rs`) against a redis-server this
//! test starts.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

#[path = "../examples/tenants.rs"]
#[allow(dead_code)]
mod tenants;

#[test]
fn the_readme_example_runs_the_seeds_operations() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let seen = tenants::run(&redis.url()).unwrap();
    let has = |s: &str| seen.iter().any(|l| l.starts_with(s));
    for t in ["acme", "globex", "initech"] {
        assert!(has(&format!("start {t}")), "{seen:?}");
    }
    assert!(has("notify acme: reload"), "{seen:?}");
    assert!(has("stop globex: Requested"), "{seen:?}");
    assert!(
        has("stop acme: Shutdown") || has("stop acme: Moved"),
        "{seen:?}"
    );
    assert!(has("stop initech: Shutdown"), "{seen:?}");
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    // Only the mark that keeps the shut-down pool shut.
    assert_eq!(keys, vec!["{sjp:tenants}:closed"]);
}
