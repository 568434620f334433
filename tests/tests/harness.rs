//! The harness itself: a server it starts answers, and one it kills stops answering.

use toolhost_e2e::RedisProcess;

#[test]
fn a_started_server_answers_until_it_is_killed() {
    let mut server = RedisProcess::start(&[]);
    assert!(server.ping());
    let port: String = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query::<Vec<String>>(&mut server.connection())
        .unwrap()
        .remove(1);
    assert_eq!(port, server.port().to_string());
    server.kill();
    assert!(!server.ping());
}
