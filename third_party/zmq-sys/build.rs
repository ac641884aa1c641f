//! libzmq from zeromq-src's vendored source, with CURVE: libsodium-sys-stable (a direct
//! dependency, `links = "sodium"`) hands its include and library directories over as
//! `DEP_SODIUM_INCLUDE` / `DEP_SODIUM_LIB`.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let include = env::var("DEP_SODIUM_INCLUDE")
        .expect("libsodium-sys-stable did not report its include directory (DEP_SODIUM_INCLUDE)");
    let lib = env::var("DEP_SODIUM_LIB")
        .expect("libsodium-sys-stable did not report its library directory (DEP_SODIUM_LIB)");
    // libzmq's own sources warn (-Wextra) in ways that are not ours to fix; as a path
    // dependency every warning would print in each build of the workspace.
    let flags = env::var("CXXFLAGS").unwrap_or_default();
    env::set_var("CXXFLAGS", format!("{flags} -w"));
    zeromq_src::Build::new()
        .with_libsodium(Some(zeromq_src::LibLocation::new(lib, include)))
        .build();
}
