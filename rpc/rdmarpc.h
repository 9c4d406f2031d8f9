// The public API in one include: Server, Channel, Status/Result, contexts, logging.
#pragma once

#include "rpc/channel.h"
#include "rpc/context.h"
#include "rpc/event_loop.h"
#include "rpc/logging.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "rpc/status.h"
#include "rpc/stream.h"
