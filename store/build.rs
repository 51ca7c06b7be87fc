//! Compiles `proto/kvstore.proto` into the tonic client and server code (needs `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/kvstore.proto");
    tonic_prost_build::configure()
        .bytes(".kvstore.v1")
        .compile_protos(&["proto/kvstore.proto"], &["proto"])?;
    Ok(())
}
