"""rdmarpc_cc_library: .proto files -> one cc_library with the messages and rdmarpc stubs.

Like gRPC's cc_grpc_library, but one rule does both protoc outputs. Runs Debian's /usr/bin/protoc
with protoc-gen-rdmarpc; Google's well-known types resolve from /usr/include.

    rdmarpc_cc_library(
        name = "echo_proto",
        srcs = ["echo.proto"],
        deps = ["//proto:common_proto"],   # other rdmarpc_cc_library targets it imports
    )

Or from an existing proto_library (its messages then come from this one library, so other
generators can share the proto_library; it must be in the same package, without
import_prefix / strip_import_prefix):

    proto_library(name = "greeter_proto", srcs = ["greeter.proto"])
    rdmarpc_cc_library(name = "greeter_rdmarpc", proto = ":greeter_proto")

Include the outputs from the workspace root: #include "proto/echo.rdmarpc.pb.h".
The library carries -std=c++20 (the stubs are coroutines); code that includes its headers must
be compiled as C++20 too (build --cxxopt=-std=c++20 in .bazelrc).
"""

RdmarpcProtoInfo = provider(
    doc = "The .proto files of a library and of everything it imports.",
    fields = {"transitive_srcs": "depset of .proto Files"},
)

_PROTOC = "/usr/bin/protoc"

def _gen_impl(ctx):
    # Paths are taken relative to the root of the repository holding this target, so a library
    # defined in an external repository generates the same #include paths as in its own.
    root = ctx.label.workspace_root or "."
    roots = [root]
    dep_srcs = [d[RdmarpcProtoInfo].transitive_srcs for d in ctx.attr.deps]
    if ctx.attr.proto:
        if ctx.files.srcs:
            fail("give srcs or proto, not both")
        info = ctx.attr.proto[ProtoInfo]
        sources = info.direct_sources
        transitive = depset(transitive = [info.transitive_sources] + dep_srcs)
        roots = roots + [r for r in info.transitive_proto_path.to_list() if r not in roots]
    else:
        if not ctx.files.srcs:
            fail("give srcs (.proto files) or proto (a proto_library)")
        sources = ctx.files.srcs
        transitive = depset(sources, transitive = dep_srcs)
    hdrs = []
    srcs = []
    for src in sources:
        if "_virtual_imports" in src.path:
            fail("%s: proto_library with import_prefix or strip_import_prefix is not supported" %
                 src.short_path)
        # The file's path in its repository: a file of an external repository has a short_path
        # of "../REPO/PATH".
        path = src.short_path
        if path.startswith("../"):
            path = path.split("/", 2)[2]
        if not path.startswith(ctx.label.package + "/") and ctx.label.package:
            fail("%s must be inside package %s" % (src.short_path, ctx.label.package))
        rel = path[len(ctx.label.package) + 1 if ctx.label.package else 0:]
        stem = rel[:-len(".proto")]
        hdrs.append(ctx.actions.declare_file(stem + ".pb.h"))
        hdrs.append(ctx.actions.declare_file(stem + ".rdmarpc.pb.h"))
        srcs.append(ctx.actions.declare_file(stem + ".pb.cc"))
        srcs.append(ctx.actions.declare_file(stem + ".rdmarpc.pb.cc"))

    args = ctx.actions.args()
    args.add("--plugin=protoc-gen-rdmarpc=" + ctx.executable._plugin.path)
    out = ctx.bin_dir.path + ("/" + ctx.label.workspace_root if ctx.label.workspace_root else "")
    args.add("--cpp_out=" + out)
    args.add("--rdmarpc_out=" + out)
    for r in roots:
        args.add("-I" + r)
    args.add("-I/usr/include")
    args.add_all([s.path for s in sources])
    ctx.actions.run(
        executable = _PROTOC,
        arguments = [args],
        inputs = transitive,
        tools = [ctx.executable._plugin],
        outputs = hdrs + srcs,
        mnemonic = "RdmarpcProtoc",
        progress_message = "Generating C++ and rdmarpc stubs for %s" % ctx.label,
    )
    return [
        DefaultInfo(files = depset(hdrs + srcs)),
        OutputGroupInfo(hdrs = depset(hdrs), srcs = depset(srcs)),
        RdmarpcProtoInfo(transitive_srcs = transitive),
    ]

_rdmarpc_proto_gen = rule(
    implementation = _gen_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".proto"]),
        "proto": attr.label(providers = [ProtoInfo]),
        "deps": attr.label_list(providers = [RdmarpcProtoInfo]),
        "_plugin": attr.label(
            default = Label("//tools/codegen:protoc-gen-rdmarpc"),
            executable = True,
            cfg = "exec",
        ),
    },
)

def _gen_label(dep):
    if ":" in dep:
        return dep + "_gen"
    return dep + ":" + dep.split("/")[-1] + "_gen"

def rdmarpc_cc_library(name, srcs = [], proto = None, deps = [], visibility = None, testonly = False):
    """A cc_library with protoc's C++ messages and rdmarpc's stubs for `srcs` (or `proto`).

    Args:
      name: the cc_library's name.
      srcs: .proto files in this package.
      proto: instead of srcs, a proto_library in this package.
      deps: other rdmarpc_cc_library targets whose .proto files `srcs` import.
      visibility: as for cc_library.
      testonly: as for cc_library.
    """
    gen = name + "_gen"
    _rdmarpc_proto_gen(
        name = gen,
        srcs = srcs,
        proto = proto,
        deps = [_gen_label(d) for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    native.filegroup(name = name + "_hdrs", srcs = [":" + gen], output_group = "hdrs", testonly = testonly)
    native.filegroup(name = name + "_srcs", srcs = [":" + gen], output_group = "srcs", testonly = testonly)
    native.cc_library(
        name = name,
        srcs = [":" + name + "_srcs"],
        hdrs = [":" + name + "_hdrs"],
        copts = ["-std=c++20"],
        deps = deps + [
            Label("//rpc"),
            Label("//third_party/system:protobuf"),
        ],
        visibility = visibility,
        testonly = testonly,
    )
