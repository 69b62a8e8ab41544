from app.users import get_usr


def build_report(ids):
    return "report: " + ", ".join(get_usr(i) for i in ids)
