//! A PostgreSQL database of its own for one test, on the server `WARDEN_TEST_POSTGRES_URL`
//! names (`cargo xtask test` starts one in a private data directory). Shared by the test
//! binaries that run a store on PostgreSQL (`#[path]`-included, not a test binary).
//! Without the variable a test fails, saying how to run it: never skipped.

/// A database of its own for one test, on the server `WARDEN_TEST_POSTGRES_URL` names.
pub struct TestDatabase {
    /// The server URL as given (connects to its maintenance database).
    pub admin: String,
    /// This test's database.
    pub name: String,
    /// The URL of this test's database.
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> TestDatabase {
        let admin = std::env::var("WARDEN_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!(
                "WARDEN_TEST_POSTGRES_URL is not set: the PostgreSQL store tests need a server. Run them with \
                 `cargo xtask test` (it starts Debian's PostgreSQL in a private data directory and sets the variable)"
            )
        });
        let name = format!("warden_test_{}", uuid::Uuid::new_v4().simple());
        let client = admin_client(&admin).await;
        client.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap_or_else(|e| panic!("{e:?}"));
        let url = with_database(&admin, &name);
        TestDatabase { admin, name, url }
    }

    pub async fn drop_database(self) {
        let client = admin_client(&self.admin).await;
        client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).await.unwrap();
    }
}

pub async fn admin_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to WARDEN_TEST_POSTGRES_URL: {e:?}"));
    tokio::spawn(conn);
    client
}

/// `url` naming database `name` instead (the path of `postgres://user@host:port/db?query`).
fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("WARDEN_TEST_POSTGRES_URL is a postgres:// URL");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let query = tail.split_once('?').map(|(_, q)| format!("?{q}")).unwrap_or_default();
    format!("{scheme}://{authority}/{name}{query}")
}
