/* Downloads with libcurl, for rank-0 dataset preparation. The body goes to
 * "<dest>.part.<pid>", is synced and renamed only when the transfer and
 * the HTTP status were both good, so an interrupted download is never
 * mistaken for data. Compiled only when libcurl is found (prepare.c holds
 * the stub). */
#include "data/data_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct {
    FILE *f;
    bool write_failed;
} sink;

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    sink *s = ud;
    size_t w = fwrite(p, size, n, s->f);
    if (w != n) s->write_failed = true;
    return w * size;
}

typedef struct {
    const char *url;
    long timeout_s;
} dl_args;

static lk_status download_body(const char *tmp, const void *ctx) {
    const dl_args *a = ctx;
    FILE *f = fopen(tmp, "wb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno));
    CURL *c = curl_easy_init();
    if (!c) {
        fclose(f);
        return lk_error(LK_STATUS_INTERNAL, "download %s: curl_easy_init failed", a->url);
    }
    sink s = {f, false};
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, a->url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, a->timeout_s);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, a->timeout_s < 30 ? a->timeout_s : 30L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    bool close_failed = fclose(f) != 0;
    if (s.write_failed || close_failed) return lk_error(LK_STATUS_IO, "download %s: writing %s failed (disk full?)", a->url, tmp);
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return lk_error(LK_STATUS_TIMEOUT, "download %s: timed out after %ld s", a->url, a->timeout_s);
    if (rc != CURLE_OK)
        return lk_error(LK_STATUS_IO, "download %s: %s", a->url, errbuf[0] ? errbuf : curl_easy_strerror(rc));
    if (code != 0 && (code < 200 || code >= 300)) /* 0: file:// and the like */
        return lk_error(LK_STATUS_IO, "download %s: the server answered HTTP %ld", a->url, code);
    return LK_STATUS_OK;
}

lk_status lk_data_download(const char *url, const char *dest, long timeout_s) {
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return lk_error(LK_STATUS_INTERNAL, "download %s: curl_global_init failed: %s", url, curl_easy_strerror(curl_init_rc));
    dl_args a = {url, timeout_s > 0 ? timeout_s : 300};
    return lk__write_atomic(dest, download_body, &a);
}
