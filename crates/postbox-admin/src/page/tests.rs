use super::*;

#[test]
fn forms_from_elsewhere_are_refused() {
    let mut h = HeaderMap::new();
    h.insert(
        header::HOST,
        "127.0.0.1:9187".parse().unwrap_or_else(|_| unreachable!()),
    );
    assert!(same_origin(&h), "no Origin: a non-browser client");
    h.insert(
        header::ORIGIN,
        "http://127.0.0.1:9187"
            .parse()
            .unwrap_or_else(|_| unreachable!()),
    );
    assert!(same_origin(&h));
    h.insert(
        header::ORIGIN,
        "http://evil.example"
            .parse()
            .unwrap_or_else(|_| unreachable!()),
    );
    assert!(!same_origin(&h));
    h.insert(
        "sec-fetch-site",
        "cross-site".parse().unwrap_or_else(|_| unreachable!()),
    );
    assert!(!same_origin(&h));
    h.insert(
        "sec-fetch-site",
        "same-origin".parse().unwrap_or_else(|_| unreachable!()),
    );
    assert!(same_origin(&h));
}

#[test]
fn ages_read_as_a_person_would() {
    assert_eq!(age(Duration::from_millis(250)), "250 ms");
    assert_eq!(age(Duration::from_secs(5)), "5.0 s");
    assert_eq!(age(Duration::from_secs(600)), "10 min");
    assert_eq!(age(Duration::from_secs(3 * 3600)), "3.0 h");
}

#[test]
fn values_are_escaped() {
    let page = LoginPage {
        message: Some("<script>alert(1)</script>"),
    };
    let body = page.render().unwrap_or_default();
    assert!(!body.contains("<script>alert"), "{body}");
    assert!(body.contains("&#60;script&#62;") || body.contains("&lt;script&gt;"));
}
