# Copies one of etcd's v3 API .proto files (Debian's golang-etcd-server-dev)
# to OUT without what only Go needs: the gogoproto imports and options, and
# the grpc-gateway HTTP annotations. What is left declares the same messages
# and services, so the stubs protoc makes from it speak etcd's wire format.
#   cmake -DIN=... -DOUT=... -P etcd_strip.cmake
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/[^\"]*\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/[^\"]*\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# Field options: [(gogoproto.nullable) = false, ...] (none in the three files
# today; stripped so that a newer etcd's files still build).
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
# option (google.api.http) = { post: "..." body: "*" }; (its additional_bindings { ... } first).
string(REGEX REPLACE "additional_bindings {[^}]*}" "" text "${text}")
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {[^}]*};" "" text "${text}")
file(WRITE "${OUT}" "${text}")
