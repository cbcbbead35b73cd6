// Decoder: turns one shared-memory ring slot into the scheduler's Request,
// once, from a private copy (the client could rewrite the slot while it is
// read). Every descriptor version the daemon accepts (v2, v1: newest first)
// has one decode function here; nothing after it reads the ABI structs.
//
// Threads: the ingress thread.
#pragma once

#include "abi/descriptor_v1.h"
#include "server/scheduler/request.h"

namespace dmagather::server::ingress {

// Decodes `slot`. An unknown stamp leaves out->refusal set (InvalidArgument
// naming the versions this daemon reads); a v2 refusal sets it to the
// rank's own status and reason.
void DecodeDescriptor(const abi::DescriptorV1& slot, scheduler::Request* out);

}  // namespace dmagather::server::ingress
