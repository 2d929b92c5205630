/*
 * respload.h — the Responses API's stored responses read back from the store when llmsd
 * starts, into the gateway's memory (daemon/net/respstore.h), before the event loop runs:
 * what an earlier run kept (responses_store = disk) answers GET, DELETE, input_items and
 * previous_response_id again, each under the uid that made it.
 */
#ifndef LLMS_RESPLOAD_H
#define LLMS_RESPLOAD_H

#include "daemon/config.h"
#include "daemon/net/respstore.h"
#include "storage/store.h"

/*
 * With responses_store = disk, trims the store to responses_store_bytes (the oldest go
 * first), then puts every stored response into mem, oldest first. A record that cannot
 * be used (damaged, its JSON or id not a response's) is skipped with a warning and
 * deleted, as is one mem does not keep (more than half the budget); a store that cannot
 * be read leaves the rest unread, with a warning. With responses_store = memory, deletes
 * every stored response. Never fails: llmsd starts whatever the store holds.
 */
void respload(store *st, respstore *mem, const config *cfg);

#endif
