"""integrations/http_calls on a real aiohttp server and client in this process, patched as a watched process's
(through a socket on 127.0.0.1: this tier): the request sent is a wait, the one served a call by its route, and
the address it came to is kept."""

from __future__ import annotations

from gkd_core.integrations import http_calls


def test_a_served_request_is_a_call_and_the_address_it_came_to_is_kept(monkeypatch):
    """A real aiohttp server and client, patched as a watched process's: the request sent is a wait, the one
    served a call by its route, and the address it came to is kept (said in the process's flow events: a
    request sent there from another node is one to this worker)."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from gkd_core.integrations.activity import Activity

    monkeypatch.setattr(web.Application, "_handle", web.Application._handle)  # put back after the test
    monkeypatch.setattr(aiohttp.ClientSession, "_request", aiohttp.ClientSession._request)
    monkeypatch.setattr(http_calls, "SERVED_AT", {})
    activity, said = Activity(lambda: None), []
    for patch, module in ((http_calls._patch_aiohttp_server, aiohttp.web_app),
                          (http_calls._patch_aiohttp_client, aiohttp.client)):
        patch(module, activity=activity, peers=http_calls.Listeners(), say_once=lambda what, e: said.append(what))

    async def generate(request: web.Request) -> web.Response:
        return web.json_response({})

    async def main() -> int:
        app = web.Application()
        app.router.add_post("/generate/{id}", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                for n in range(3):
                    async with session.post(f"http://127.0.0.1:{port}/generate/{n}") as answer:
                        await answer.read()
        finally:
            await runner.cleanup()
        return port

    port = asyncio.run(main())
    activity.close()
    assert said == []
    assert http_calls.served_at() == [f"127.0.0.1:{port}"]  # (once, however many requests came)
    assert activity.counts["POST /generate/{id}"] == 3 and activity.counts["HTTP POST"] == 3
