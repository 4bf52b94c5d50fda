/*
 * libcupti_standin_api.h -- the exported functions of cudatrace's STAND-IN libcupti
 * (included by libcupti_standin.c, which has the rules).  NOT NVIDIA's CUPTI.
 */

EXPORT CUptiResult cuptiGetVersion(uint32_t *version)
{
    if (version == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *version = multi() ? CUPTI_API_VERSION_STANDIN_MULTI : CUPTI_API_VERSION_STANDIN;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char **str)
{
    if (str == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case CUPTI_ERROR_NOT_INITIALIZED: *str = "CUPTI_ERROR_NOT_INITIALIZED"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_NOT_COMPATIBLE: *str = "CUPTI_ERROR_NOT_COMPATIBLE"; break;
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: *str = "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
        break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return CUPTI_ERROR_INVALID_PARAMETER;
    }
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
    if (timestamp == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *timestamp = ts();
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSetThreadIdType(uint32_t type)
{
    if (type > CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
        return CUPTI_ERROR_INVALID_PARAMETER;
    g_thread_id_type = type;
    return CUPTI_SUCCESS;
}

#ifndef CUPTI_STANDIN_NO_TIMESTAMP_CALLBACK
EXPORT CUptiResult cuptiActivityRegisterTimestampCallback(timestamp_fn callback)
{
    if (callback == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    /* A process-wide clock would change every subscriber's: not with several. */
    for (int i = 1; i < MAX_CLIENTS; i++)
        if (g_clients[i].in_use)
            return CUPTI_ERROR_NOT_COMPATIBLE;
    __atomic_store_n(&g_timestamp, callback, __ATOMIC_RELEASE);
    return CUPTI_SUCCESS;
}
#endif

/* New callbacks for client c: its partly filled buffer stays its requester's. */
static void set_callbacks(struct client *c, buffer_requested_fn requested,
                          buffer_completed_fn completed, buffer_requested_v2_fn requested2,
                          buffer_completed_v2_fn completed2)
{
    if (c->buffer != NULL && g_orphan_count < MAX_ORPHANS) {
        struct orphan *o = &g_orphans[g_orphan_count++];
        o->owner = owner_of(c);
        o->buffer = c->buffer;
        o->size = c->buffer_size;
        o->used = c->buffer_used;
        c->buffer = NULL;
    }
    c->requested = requested;
    c->completed = completed;
    c->requested2 = requested2;
    c->completed2 = completed2;
}

EXPORT CUptiResult cuptiActivityRegisterCallbacks(buffer_requested_fn requested,
                                                  buffer_completed_fn completed)
{
    if (requested == NULL || completed == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    set_callbacks(&g_clients[0], requested, completed, NULL, NULL);
    pthread_mutex_unlock(&g_lock);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityRegisterCallbacks_v2(void *handle,
                                                     buffer_requested_v2_fn requested,
                                                     buffer_completed_v2_fn completed)
{
    if (requested == NULL || completed == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    struct client *c = subscriber(handle);
    if (c != NULL)
        set_callbacks(c, NULL, NULL, requested, completed);
    pthread_mutex_unlock(&g_lock);
    return c == NULL ? CUPTI_ERROR_INVALID_PARAMETER : CUPTI_SUCCESS;
}

static int *kind_switch(struct client *c, uint32_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return &c->kernel_on;
    case CUPTI_ACTIVITY_KIND_MEMCPY: return &c->memcpy_on;
    case CUPTI_ACTIVITY_KIND_MEMSET: return &c->memset_on;
    case CUPTI_ACTIVITY_KIND_DRIVER: return &c->driver_locked;
    default: return NULL;
    }
}

static CUptiResult set_kind(struct client *c, uint32_t kind, int on)
{
    if (c == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    long forced = on ? env_long("CUPTI_STANDIN_ENABLE_ERROR", 0) : 0;
    if (forced != 0)
        return (CUptiResult)forced;
    int *flag = kind_switch(c, kind);
    if (flag == NULL)
        return CUPTI_ERROR_NOT_SUPPORTED;
    if (on) {
        CUptiResult rc = hook_libcuda();
        if (rc != CUPTI_SUCCESS)
            return rc;
    }
    if (kind == CUPTI_ACTIVITY_KIND_DRIVER) {
        memset(c->driver_cbid, on ? 1 : 0, sizeof(c->driver_cbid));
        c->driver_locked = !on;
        if (on)
            c->driver_kind_seen = 1;
        if (!on && env_long("CUPTI_STANDIN_NO_DRIVER_AFTER_DISABLE", 0) == 1)
            c->driver_gone = 1;
        return CUPTI_SUCCESS;
    }
    *flag = on;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnable(uint32_t kind)
{
    return set_kind(&g_clients[0], kind, 1);
}

EXPORT CUptiResult cuptiActivityDisable(uint32_t kind)
{
    return set_kind(&g_clients[0], kind, 0);
}

EXPORT CUptiResult cuptiActivityEnable_v2(void *handle, uint32_t kind, void *config)
{
    (void)config;
    return set_kind(subscriber(handle), kind, 1);
}

EXPORT CUptiResult cuptiActivityDisable_v2(void *handle, uint32_t kind, void *config)
{
    (void)config;
    return set_kind(subscriber(handle), kind, 0);
}

static CUptiResult set_driver_api(struct client *c, uint32_t cbid, uint8_t enable)
{
    if (c == NULL || cbid >= sizeof(c->driver_cbid))
        return CUPTI_ERROR_INVALID_PARAMETER;
    CUptiResult rc = hook_libcuda();
    if (rc != CUPTI_SUCCESS)
        return rc;
    if (!c->driver_locked &&
        (c->driver_kind_seen || env_long("CUPTI_STANDIN_SWITCHES_NEED_DRIVER_KIND", 0) != 1))
        c->driver_cbid[cbid] = enable ? 1 : 0;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnableDriverApi(uint32_t cbid, uint8_t enable)
{
    return set_driver_api(&g_clients[0], cbid, enable);
}

EXPORT CUptiResult cuptiActivityEnableDriverApi_v2(void *handle, uint32_t cbid, uint8_t enable)
{
    return set_driver_api(subscriber(handle), cbid, enable);
}

EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    (void)flag;
    struct orphan done[MAX_CLIENTS + MAX_ORPHANS];
    int count = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_orphan_count; i++)
        done[count++] = g_orphans[i];
    g_orphan_count = 0;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        struct client *c = &g_clients[i];
        if (c->buffer != NULL && c->buffer_used > 0) {
            done[count].owner = owner_of(c);
            done[count].buffer = c->buffer;
            done[count].size = c->buffer_size;
            done[count].used = c->buffer_used;
            count++;
            c->buffer = NULL;
        }
    }
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < count; i++)
        complete(&done[i].owner, done[i].buffer, done[i].size, done[i].used);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid,
                                              CUpti_Activity **record)
{
    if (buffer == NULL || record == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    uint8_t *next;
    if (*record == NULL) {
        next = buffer;
    } else {
        size_t size = record_size((*record)->kind);
        if (size == 0)
            return CUPTI_ERROR_INVALID_KIND;
        next = (uint8_t *)*record + size;
    }
    if (next + sizeof(uint32_t) > buffer + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    size_t size = record_size(((CUpti_Activity *)next)->kind);
    if (size == 0 || next + size > buffer + valid)
        return CUPTI_ERROR_INVALID_KIND;
    *record = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNextRecord_v2(void *handle, uint8_t *buffer, size_t valid,
                                                 CUpti_Activity **record)
{
    (void)handle;
    return cuptiActivityGetNextRecord(buffer, valid, record);
}

static CUptiResult dropped_of(struct client *c, size_t *dropped)
{
    if (c == NULL || dropped == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    size_t count = c->dropped;
    c->dropped = 0;
    if (!g_dropped_reported) {
        g_dropped_reported = 1;
        count += (size_t)env_long("CUPTI_STANDIN_DROPPED", 0);
    }
    pthread_mutex_unlock(&g_lock);
    *dropped = count;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                                     size_t *dropped)
{
    (void)context;
    (void)stream_id;
    return dropped_of(&g_clients[0], dropped);
}

EXPORT CUptiResult cuptiActivityGetNumDroppedRecords_v2(void *handle, CUcontext context,
                                                        uint32_t stream_id, size_t *dropped)
{
    (void)context;
    (void)stream_id;
    return dropped_of(subscriber(handle), dropped);
}

EXPORT CUptiResult cuptiSubscribe(void **handle, void *callback, void *userdata)
{
    if (handle == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    int taken = g_callback_subscribed;
    if (!taken) {
        g_callback_subscribed = 1;
        g_cb_fn = (api_callback_fn)callback;
        g_cb_user = userdata;
        memset(g_cb_driver, 0, sizeof(g_cb_driver));
    }
    pthread_mutex_unlock(&g_lock);
    if (taken)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    *handle = (void *)(uintptr_t)0x5ab;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, void *handle, uint32_t domain,
                                       uint32_t cbid)
{
    if (handle != (void *)(uintptr_t)0x5ab || domain != 1 || cbid >= sizeof(g_cb_driver))
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    int subscribed = g_callback_subscribed;
    if (subscribed)
        g_cb_driver[cbid] = enable ? 1 : 0;
    pthread_mutex_unlock(&g_lock);
    if (!subscribed)
        return CUPTI_ERROR_INVALID_PARAMETER;
    hook_libcuda();
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, void *handle, uint32_t domain)
{
    if (handle != (void *)(uintptr_t)0x5ab || domain != 1)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    int subscribed = g_callback_subscribed;
    if (subscribed)
        memset(g_cb_driver, enable ? 1 : 0, sizeof(g_cb_driver));
    pthread_mutex_unlock(&g_lock);
    if (!subscribed)
        return CUPTI_ERROR_INVALID_PARAMETER;
    hook_libcuda();
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSubscribe_v2(void **handle, void *callback, void *userdata,
                                     subscriber_params *params)
{
    (void)callback;
    (void)userdata;
    if (handle == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (!multi() || params == NULL || !params->allowMultipleSubscribers)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    uintptr_t slot = 0;
    for (uintptr_t i = 1; i < MAX_CLIENTS && slot == 0; i++)
        if (!g_clients[i].in_use)
            slot = i;
    if (slot != 0) {
        memset(&g_clients[slot], 0, sizeof(g_clients[slot]));
        g_clients[slot].in_use = 1;
    }
    pthread_mutex_unlock(&g_lock);
    if (slot == 0)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *handle = (void *)slot;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiUnsubscribe(void *handle)
{
    pthread_mutex_lock(&g_lock);
    struct client *c = subscriber(handle);
    if (c != NULL) {
        c->in_use = 0;
        c->requested2 = NULL;
        c->completed2 = NULL;
    } else {
        g_callback_subscribed = 0;
        g_cb_fn = NULL;
        g_cb_user = NULL;
        memset(g_cb_driver, 0, sizeof(g_cb_driver));
    }
    pthread_mutex_unlock(&g_lock);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiFinalize(void)
{
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&g_lock);
    memset(&g_clients[0], 0, sizeof(g_clients[0]));
    g_callback_subscribed = 0;
    g_cb_fn = NULL;
    g_cb_user = NULL;
    memset(g_cb_driver, 0, sizeof(g_cb_driver));
    __atomic_store_n(&g_timestamp, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return CUPTI_SUCCESS;
}

EXPORT int cudatrace_standin_cupti_recording(uint32_t cbid)
{
    int count = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_CLIENTS; i++) {
        const struct client *c = &g_clients[i];
        if (has_callbacks(c) && c->kernel_on && cbid < sizeof(c->driver_cbid) &&
            c->driver_cbid[cbid])
            count++;
    }
    if (g_cb_fn != NULL && cbid < sizeof(g_cb_driver) && g_cb_driver[cbid])
        count++;
    pthread_mutex_unlock(&g_lock);
    return count;
}
