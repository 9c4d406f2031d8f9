"""rdmarpc_dependencies(): what a WORKSPACE needs to build rdmarpc, offline, on Debian's Bazel.

In your WORKSPACE:

    local_repository(name = "rdmarpc", path = "/path/to/rdmarpc")
    load("@rdmarpc//:deps.bzl", "rdmarpc_dependencies")
    rdmarpc_dependencies()

Debian's bazel-bootstrap 4.2.3 lacks the embedded copies of three repositories that every C++
build and test touches (@rules_cc, @rules_java, @remote_coverage_tools), so without them Bazel
tries to download them and fails. This declares local stand-ins that forward to Bazel's native
rules, plus @com_google_protobuf: a stand-in that runs Debian's /usr/bin/protoc for native
proto_library rules and offers Google's well-known types as proto_library targets
(@com_google_protobuf//:empty_proto, :timestamp_proto, ...), all from the libprotobuf-dev and
protobuf-compiler packages. A repository you declare yourself before calling this is left alone.

Everything else rdmarpc needs comes from Debian's packages (tools/setup.sh installs them).
"""

_WELL_KNOWN = [
    "any",
    "api",
    "descriptor",
    "duration",
    "empty",
    "field_mask",
    "source_context",
    "struct",
    "timestamp",
    "type",
    "wrappers",
]

def _copy_standin_impl(rctx):
    # The stand-in's files live in this repository, under third_party/bazel/<folder>.
    root = rctx.path(Label("//:deps.bzl")).dirname
    src = root.get_child("third_party").get_child("bazel").get_child(rctx.attr.folder)
    result = rctx.execute(["cp", "-R", str(src) + "/.", "."])
    if result.return_code != 0:
        fail("rdmarpc: cannot copy %s: %s" % (src, result.stderr))

_copy_standin = repository_rule(
    implementation = _copy_standin_impl,
    attrs = {"folder": attr.string(mandatory = True)},
    local = True,
)

def _system_protobuf_impl(rctx):
    protoc = rctx.which("protoc")
    if protoc == None:
        fail("rdmarpc: protoc not found; install protobuf-compiler (tools/setup.sh does)")
    rctx.file("WORKSPACE", 'workspace(name = "com_google_protobuf")\n')
    rctx.symlink(protoc, "protoc_bin")
    rctx.symlink("/usr/include/google/protobuf", "google/protobuf")
    build = [
        'package(default_visibility = ["//visibility:public"])',
        "",
        "# Debian's protoc (protobuf-compiler), for proto_library's --proto_compiler default.",
        'sh_binary(name = "protoc", srcs = ["protoc_bin"])',
        "",
        "# Google's well-known types, from libprotobuf-dev's /usr/include/google/protobuf.",
    ]
    for name in _WELL_KNOWN:
        deps = []
        if name == "api":
            deps = [":source_context_proto", ":type_proto"]
        if name == "type":
            deps = [":any_proto", ":source_context_proto"]
        build.append('proto_library(name = "%s_proto", srcs = ["google/protobuf/%s.proto"], deps = %s)' %
                     (name, name, deps))
    build.append('filegroup(name = "well_known_protos", srcs = [%s])' %
                 ", ".join(['"google/protobuf/%s.proto"' % n for n in _WELL_KNOWN]))
    rctx.file("BUILD", "\n".join(build) + "\n")

_system_protobuf = repository_rule(
    implementation = _system_protobuf_impl,
    local = True,
)

def rdmarpc_dependencies():
    """Declares the repositories rdmarpc needs that are not already declared."""
    existing = native.existing_rules()
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        if name not in existing:
            _copy_standin(name = name, folder = name)
    if "com_google_protobuf" not in existing:
        _system_protobuf(name = "com_google_protobuf")
