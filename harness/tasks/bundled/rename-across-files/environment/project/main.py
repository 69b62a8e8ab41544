from app.report import build_report
from app.users import get_usr

assert get_usr(1) == "alice"
print(build_report([1, 2]))
