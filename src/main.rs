fn main() {
    std::process::exit(hipscope::app::main());
}
